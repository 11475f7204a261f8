"""Learning When to Search's rewards (LWTS §3.3).

LWTS: "Learning When to Search: Multi-Stage Reward Design for Efficient Agentic RAG with
Reasoning Language Models" (anonymous ACL submission, no arXiv id).

``r_sum = r_a + r_f + r_s``, given once per episode, at its end (termination or truncation):
the format reward r_f (eq. 6), the search reward r_s (eqs. 7-9) and the multi-stage answer
reward r_a (eqs. 10-11, β = 0.3). They read the model's text, so they wrap a
:class:`~rag_gym.wrappers.TextActions` env (tag preset ``when_to_search``).

>>> import rag_gym
>>> base = rag_gym.make("rag_gym/SynthHop-v0", text_actions="when_to_search", dataset_kwargs={"n_passages": 2000, "n_questions": [40, 10, 10]})
>>> env = MultiStageAnswerReward(LWTSFormatReward(base))
>>> obs, info = env.reset(seed=0)
>>> _, reward, terminated, _, info = env.step("<think>I know it.</think><reflect>Sure.</reflect><answer>x</answer>")
>>> info["reward_raw"]["lwts_format"], info["reward_raw"]["lwts_answer"]
(1.0, -1.0)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from rag_gym.envs.search import SearchEnv
from rag_gym.rewards import core
from rag_gym.wrappers.base import RewardTerm
from rag_gym.wrappers.presets import PRESETS, RewardPreset


def _is_text_env(env: gym.Env) -> bool:
    from rag_gym.wrappers.text_actions import text_actions_of

    return text_actions_of(env) is not None


class _EpisodeText(RewardTerm):
    """Collects the episode's tag sequence (model tags, plus ``information`` where the env
    returned passages) and its search queries; scores at the episode's end."""

    def __init__(self, env: gym.Env, weight: float = 1.0, **kwargs) -> None:
        super().__init__(env, weight=weight, **kwargs)
        if not _is_text_env(env):
            raise ValueError(
                f"{type(self).__name__} reads the model's text: wrap a TextActions env"
            )
        self._tags: list[str] = []
        self._queries: list[str] = []

    def on_reset(self, obs, info) -> None:
        self._tags, self._queries = [], []

    def term(self, action, obs, terminated, truncated, info) -> float:
        self._tags.extend(t for t in info.get("tags", []) if t != "information")
        if "<information>" in (obs or ""):
            self._tags.append("information")
        self._queries.extend(info.get("queries", []))
        if not (terminated or truncated):
            return 0.0
        return self.score(info)

    def score(self, info) -> float:
        raise NotImplementedError


class LWTSFormatReward(_EpisodeText):
    """r_f (eq. 6): +1 when the episode's tags follow think, reflect, answer, or rounds of think,
    search, information, reflect then answer; −1 otherwise."""

    name = "lwts_format"

    def score(self, info) -> float:
        return core.lwts_format(self._tags)


class LWTSSearchReward(_EpisodeText):
    """r_s (eq. 9): 0 if the queries are concise and RC <= 1, −1 if not concise and RC <= 1,
    −avg_sim if RC > 1. Conciseness: :func:`rag_gym.rewards.core.is_concise` (documented word
    lists). ``normalization="printed"`` divides the pairwise-cosine sum by N (N − 1) as eq. 8
    prints; ``"mean"`` takes the plain mean over pairs. Embeddings: all-MiniLM-L6-v2 (embedded)
    or ``encoder``."""

    name = "lwts_search"

    def __init__(
        self,
        env: gym.Env,
        weight: float = 1.0,
        normalization: str = "printed",
        encoder: str | Callable | None = None,
    ) -> None:
        if normalization not in ("printed", "mean"):
            raise ValueError(f"expected normalization 'printed' or 'mean', got {normalization!r}")
        super().__init__(
            env,
            weight=weight,
            normalization=normalization,
            encoder=encoder if not callable(encoder) else None,
        )
        self.normalization = normalization
        self._encoder_arg = encoder
        self._encoder: Callable | None = encoder if callable(encoder) else None

    def _encode(self, texts: list[str]) -> np.ndarray:
        if self._encoder is None:
            from rag_gym.retrieval.encoders import SentenceEncoder, default_encoder

            self._encoder = (
                default_encoder()
                if self._encoder_arg is None
                else SentenceEncoder(self._encoder_arg)
            )
        return np.asarray(self._encoder(texts))

    def score(self, info) -> float:
        queries = self._queries
        avg = (
            core.lwts_avg_sim(self._encode(queries), self.normalization)
            if len(queries) > 1
            else 0.0
        )
        return core.lwts_search(queries, avg)


class MultiStageAnswerReward(_EpisodeText):
    """r_a (eqs. 10-11), β = 0.3, RC the episode's searches. Stage 1: correct 1, wrong
    −1 + β·RC; stage 2: correct 1 − β·RC, wrong −1. ``correctness``: ``"em"`` (default),
    ``"cover_em"``, or a :class:`rag_gym.rewards.core.Correctness` with an LLM judge. An episode
    that ends without an answer counts as wrong. :meth:`set_stage` switches at run time."""

    name = "lwts_answer"

    def __init__(
        self,
        env: gym.Env,
        weight: float = 1.0,
        stage: int = 1,
        beta: float = core.LWTS_BETA,
        correctness: str | core.Correctness = "em",
    ) -> None:
        if stage not in (1, 2):
            raise ValueError(f"expected stage 1 or 2, got {stage!r}")
        super().__init__(
            env,
            weight=weight,
            stage=stage,
            beta=beta,
            correctness=correctness if isinstance(correctness, str) else correctness.method,
        )
        self.stage = stage
        self.beta = float(beta)
        self.correctness = (
            correctness
            if isinstance(correctness, core.Correctness)
            else core.Correctness(correctness)
        )

    def set_stage(self, stage: int) -> None:
        if stage not in (1, 2):
            raise ValueError(f"expected stage 1 or 2, got {stage!r}")
        self.stage = stage

    def score(self, info) -> float:
        example = self.env.unwrapped.current_example
        correct = self.correctness(example.question, info.get("prediction"), list(example.answers))
        return core.lwts_answer(correct, len(self._queries), self.stage, self.beta)


def _preset(env: gym.Env, *, t_max: int | None = None, **kwargs: Any) -> gym.Env:
    """``r_a + r_s + r_f`` at the episode's end (LWTS eq. 12), on the text env."""
    env = LWTSFormatReward(env)
    env = LWTSSearchReward(
        env, normalization=kwargs.get("normalization", "printed"), encoder=kwargs.get("encoder")
    )
    return MultiStageAnswerReward(
        env, stage=kwargs.get("stage", 1), correctness=kwargs.get("correctness", "em")
    )


PRESETS.register(
    "when_to_search",
    RewardPreset(
        _preset,
        SearchEnv,
        {"stage", "encoder", "correctness", "normalization"},
        "when_to_search",
        agent="lwts",
        text_in=True,
        recipe={
            "env_id": "rag_gym/SynthHop-v0",
            "env_kwargs": {"k": 5},
            "reward_preset": "when_to_search",
            "max_episode_steps": 5,
            "max_turns": 5,
            "algorithm": "dapo",
            "num_generations": 32,
            "beta": 1e-4,
            "learning_rate": 1e-6,
            "temperature": 1.0,
            "stages": ((1, 0.5), (2, 1.0)),
            "exp_name": "lwts_dapo",
        },
    ),
    origin="rag-gym",
)

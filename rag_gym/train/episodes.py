"""The one set-up every trainer plays episodes in: the text-action env, the rollout engine over
it, and greedy held-out evaluation.

GRPO/DAPO (:mod:`~rag_gym.train.grpo`), SFT (:mod:`~rag_gym.train.sft`) and EVO-RAG's DPO
(:mod:`~rag_gym.train.evo_rag_dpo`) each describe their env with a :class:`TextEnvSpec` (their
config's ``text_env()``), so training and evaluation play the same env, reward and turn limits.

>>> spec = TextEnvSpec("rag_gym/SynthHop-v0", reward_preset="eval_rar")
>>> spec.tags_or_default, TextEnvSpec("rag_gym/SynthHop-v0").tags_or_default
('eval_rar', 'search_r1')
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

import gymnasium as gym

from rag_gym.train.rollout import Episode, RolloutEngine, make_generator
from rag_gym.wrappers.presets import default_tags

#: The :class:`TextEnvSpec` fields that limit an episode's turns and tokens (the
#: :class:`~rag_gym.train.rollout.RolloutEngine`'s options; the others build the env).
TURN_LIMITS = ("max_turns", "max_turn_tokens", "max_completion_tokens")


def played_tags(env: gym.Env) -> str | None:
    """The name of the tag set ``env``'s :class:`~rag_gym.wrappers.TextActions` parses (the one a
    policy trained in it writes), or ``None`` for an env without one (tree, reader)."""
    from rag_gym.wrappers.text_actions import text_actions_of

    found = text_actions_of(env)
    return found.tags.name if found is not None else None


def env_factory(
    env_id: str,
    split: str = "train",
    reward_preset: str = "none",
    reward_kwargs: dict[str, Any] | None = None,
    tags: str | None = None,
    max_episode_steps: int | None = None,
    step_cost: float = 0.0,
    refusal: float = 0.0,
    refusal_verifier: str = "answerable",
    retrieval_hit: float = 0.0,
    judge: str | None = None,
    judge_weight: float = 1.0,
    **env_kwargs: Any,
) -> Callable[[], gym.Env]:
    """A function that builds the text-action env a policy trains in: :func:`rag_gym.make` with
    the reward preset, ``text_actions=tags`` (``None``: ``True``), and as ``extra_terms`` EVO-RAG's
    :class:`~rag_gym.wrappers.StepCost` when ``step_cost`` > 0, its
    :class:`~rag_gym.wrappers.RefusalReward` when ``refusal`` > 0 and its
    :class:`~rag_gym.wrappers.RetrievalHitReward` (the gold-hit term) when ``retrieval_hit`` > 0
    (the weights η, ρ and β, on top of the preset's reward). ``refusal_verifier`` names the
    refusal reward's sufficiency verifier (:data:`~rag_gym.wrappers.evo_rag.REFUSAL_VERIFIERS`):
    by default ``"answerable"``, the env's ground truth, because ``"evidence"`` (the evidence so
    far, as the paper's LLM judge sees it) rewards refusing before searching. ``judge`` (a backend
    spec) adds :class:`~rag_gym.wrappers.JudgedAnswerReward` with weight ``judge_weight``: one
    :class:`~rag_gym.generation.judges.LLMAnswerJudge`, shared by the factory's envs."""
    weights = (("step_cost", step_cost), ("refusal", refusal), ("retrieval_hit", retrieval_hit))
    for name, weight in weights:
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight >= 0:
            raise ValueError(f"expected {name} >= 0, got {weight!r}")
    from functools import partial

    import rag_gym
    from rag_gym.wrappers.evo_rag import (
        RefusalReward,
        RetrievalHitReward,
        StepCost,
        refusal_verifier_name,
    )
    from rag_gym.wrappers.judged import JudgedAnswerReward

    refusal_verifier_name(refusal_verifier)
    if judge is not None and (not isinstance(judge, str) or not judge):
        raise ValueError(f"expected judge to be a backend spec such as 'llama_cpp', got {judge!r}")
    terms: list[Callable[[gym.Env], gym.Env]] = []
    if step_cost:
        terms.append(partial(StepCost, weight=float(step_cost)))
    if refusal:
        terms.append(partial(RefusalReward, weight=float(refusal), verifier=refusal_verifier))
    if retrieval_hit:
        terms.append(partial(RetrievalHitReward, weight=float(retrieval_hit)))
    if judge is not None:
        from rag_gym.generation.backends import make_lm
        from rag_gym.generation.judges import LLMAnswerJudge

        shared = LLMAnswerJudge(make_lm(judge))
        terms.append(partial(JudgedAnswerReward, judge=shared, weight=float(judge_weight)))
    return partial(
        rag_gym.make,
        env_id,
        reward_preset,
        reward_kwargs=dict(reward_kwargs or {}) or None,
        max_episode_steps=max_episode_steps,
        text_actions=tags or True,
        extra_terms=terms,
        **{**env_kwargs, "split": split},
    )


@dataclass(frozen=True)
class TextEnvSpec:
    """A trainer's text-action env and the turn limits of its episodes."""

    env_id: str
    """A registered id (``rag-gym envs`` lists them)."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra ``gym.make`` keyword arguments."""
    reward_preset: str = "none"
    """A reward preset of :mod:`rag_gym.wrappers.presets` (``none``: the env's own reward)."""
    reward_kwargs: dict[str, Any] = field(default_factory=dict)
    """Options of the preset."""
    tags: str | None = None
    """The tag preset; ``None``: :func:`default_tags` of the reward preset."""
    max_episode_steps: int | None = None
    """The env's horizon; ``None`` keeps the preset's."""
    step_cost: float = 0.0
    """Weight of EVO-RAG's per-step cost (0 leaves it out)."""
    refusal: float = 0.0
    """Weight of EVO-RAG's refusal reward (0 leaves it out)."""
    refusal_verifier: str = "answerable"
    """Its sufficiency verifier: ``"answerable"`` (the env's ground truth) or ``"evidence"`` (every
    gold passage retrieved so far); see :func:`env_factory`."""
    retrieval_hit: float = 0.0
    """Weight of EVO-RAG's retrieval-hit (gold-hit) term (0 leaves it out)."""
    judge: str | None = None
    """An LLM judge's backend spec: its verdict on answers the env scores below 1 is a reward term
    (:class:`~rag_gym.wrappers.JudgedAnswerReward`); ``None`` leaves it out."""
    judge_weight: float = 1.0
    """Its weight."""
    max_turns: int = 8
    """Model turns per episode at most."""
    max_turn_tokens: int = 128
    """New tokens per turn at most."""
    max_completion_tokens: int = 1024
    """Model + env tokens per episode at most."""

    def text_env(self) -> TextEnvSpec:
        """Itself (so :func:`rollout_engine` takes a spec as it takes a trainer config)."""
        return self

    @property
    def tags_or_default(self) -> str:
        return self.tags or default_tags(self.reward_preset)

    def make_env(self, split: str) -> Callable[[], gym.Env]:
        """:func:`env_factory` of this env on ``split``."""
        options = {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name not in ("env_id", "env_kwargs", *TURN_LIMITS)
        }
        return env_factory(self.env_id, split=split, **options, **self.env_kwargs)

    def engine(self, tokenizer: Any, split: str) -> RolloutEngine:
        """A :class:`~rag_gym.train.rollout.RolloutEngine` over this env on ``split``."""
        limits = {name: getattr(self, name) for name in TURN_LIMITS}
        return RolloutEngine(self.make_env(split), tokenizer, **limits)


def rollout_engine(cfg: Any, tokenizer: Any, split: str) -> RolloutEngine:
    """The :class:`~rag_gym.train.rollout.RolloutEngine` of a trainer config (anything with a
    ``text_env()`` returning a :class:`TextEnvSpec`) on ``split``: training and held-out
    evaluation play the same env, reward and turn limits."""
    text_env = getattr(cfg, "text_env", None)
    if text_env is None:
        raise TypeError(
            "expected a trainer config with text_env() (EnvGRPOConfig, SFTConfig, "
            f"EvoRagDPOConfig) or a TextEnvSpec, got {type(cfg).__name__}"
        )
    return text_env().engine(tokenizer, split)


def evaluate_policy(
    model: Any,
    tokenizer: Any,
    engine: RolloutEngine,
    n: int | None = None,
    batch_size: int = 16,
    stage: str | int | None = None,
    rollout_log: Any = None,
    train_step: int = 0,
) -> dict[str, Any]:
    """Greedy episodes on the first ``n`` questions (all by default) of ``engine``'s split.

    ``stage`` sets a curriculum stage on every env copy first (EVO-RAG's ``"discovery"`` /
    ``"refinement"`` weights, LWTS's 1 / 2). Returns the means of ``em``, ``return``,
    ``num_searches`` and ``turns``, the number of episodes ``n``, and ``generation``
    (the backend's :meth:`~rag_gym.generation.transformers_lm.TransformersLM.describe`: whether
    the continuous-batching engine generated, and why not). A :class:`~rag_gym.train.rollout_log.RolloutLog` saves a sample
    of the episodes as the rollouts of ``train_step`` (``rag-gym view`` shows them).
    """
    if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 0):
        raise ValueError(f"expected n to be an int >= 0 or None, got {n!r}")
    generate = make_generator(model, tokenizer, temperature=0.0, batch_size=batch_size)
    total = engine.n_questions if n is None else min(n, engine.n_questions)
    episodes: list[Episode] = []
    for start in range(0, total, batch_size):
        chunk = list(range(start, min(total, start + batch_size)))
        if stage is not None:
            from rag_gym.wrappers import presets

            engine.grow(len(chunk))
            for env in engine.envs:
                presets.set_stage(env, stage)
        episodes += engine.play(generate, chunk)
    if rollout_log is not None:
        rollout_log(train_step, episodes, force=True, label="held-out")
    return {
        "em": _mean(e.em for e in episodes),
        "return": _mean(e.episode_return for e in episodes),
        "num_searches": _mean(e.num_searches for e in episodes),
        "turns": _mean(e.turns for e in episodes),
        "n": float(len(episodes)),
        "generation": generate.lm.describe(),
    }


def _mean(values: Any) -> float:
    values = [float(v) for v in values]
    return sum(values) / len(values) if values else 0.0

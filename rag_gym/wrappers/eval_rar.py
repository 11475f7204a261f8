"""Eval-RAR's evaluation reward (Eval-RAR §4.2) on the search env with EVALUATE.

Eval-RAR: Yu et al., "Eval-RAR: Evaluation-Driven Retrieval-Augmented Reasoning via
Reinforcement Learning", Findings of ACL 2026 (no arXiv id).

``R_total = R_ans if R_ans > 0 else R_eval`` (eq. 5), with R_ans the exact match of the final
answer (eq. 2) and ``R_eval = r_eval = 0.1`` when some gold answer is a substring of the
concatenated ``<evaluate>`` texts (eqs. 3-4). The ``eval_rar`` preset is
``AnswerCorrectnessReward(metric="em")`` plus :class:`EvaluationReward`, whose term is R_eval
only when R_ans is 0, so their sum is R_total.

>>> import gymnasium as gym, rag_gym
>>> env = EvaluationReward(gym.make("rag_gym/SynthHop-v0", dataset_kwargs={"n_passages": 2000, "n_questions": [40, 10, 10]}))
>>> obs, info = env.reset(seed=0)
>>> gold = env.unwrapped.current_example.answer
>>> _ = env.step({"type": 4, "text": f"The evidence points to {gold}."})
>>> obs, reward, terminated, truncated, info = env.step({"type": 1, "text": "wrong"})
>>> info["reward_raw"]["evaluation"], reward
(0.1, 0.1)
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from rag_gym.envs.search import SearchEnv
from rag_gym.rewards import core
from rag_gym.wrappers.base import RewardTerm
from rag_gym.wrappers.presets import PRESETS, RewardPreset


class EvaluationReward(RewardTerm):
    """R_eval at the episode's end, counted only when the answer is not an exact match (eq. 5).

    Collects the text of every valid EVALUATE action of the episode (in order) and, on the last
    step (terminated, or truncated by the step limit with no answer: R_ans = 0, so R_total =
    R_eval, and Algorithm 1 returns at the step limit), gives ``r_eval`` (0.1) if some gold
    answer, normalised, is a substring of their normalised concatenation and the final answer's
    EM is 0; otherwise 0.
    """

    name = "evaluation"

    def __init__(
        self, env: gym.Env, weight: float = 1.0, r_eval: float = core.EVAL_RAR_R_EVAL
    ) -> None:
        super().__init__(env, weight=weight, r_eval=r_eval)
        self.r_eval = float(r_eval)
        self._notes: list[str] = []

    def on_reset(self, obs, info) -> None:
        self._notes = []

    def term(self, action, obs, terminated, truncated, info) -> float:
        if info.get("action_type") == "EVALUATE" and not info.get("invalid_action"):
            self._notes.append(str(action["text"]).strip())
        if not (terminated or truncated):
            return 0.0
        golds = self.env.unwrapped.current_example.answers
        r_ans = core.eval_rar_answer(info.get("prediction"), golds)
        r_eval = core.eval_rar_evaluation(self._notes, golds, self.r_eval)
        return core.eval_rar_total(r_ans, r_eval) - r_ans


def _preset(env: gym.Env, *, t_max: int | None = None, **kwargs: Any) -> gym.Env:
    """``R_ans`` (EM) if > 0 else ``R_eval`` (Eval-RAR eq. 5)."""
    from rag_gym.wrappers.evo_rag import AnswerCorrectnessReward

    return EvaluationReward(AnswerCorrectnessReward(env, metric="em"), **kwargs)


PRESETS.register(
    "eval_rar",
    RewardPreset(
        _preset,
        SearchEnv,
        {"r_eval"},
        "eval_rar",
        agent="eval_rar",
        recipe={
            "env_id": "rag_gym/SynthHop-v0",
            "env_kwargs": {"k": 3},
            "reward_preset": "eval_rar",
            "tags": "eval_rar",
            "algorithm": "grpo",
            "num_generations": 5,
            "beta": 0.001,
            "epsilon": 0.2,
            "learning_rate": 1e-6,
            "exp_name": "eval_rar_grpo",
        },
    ),
    origin="rag-gym",
)

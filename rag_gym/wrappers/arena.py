"""ARENA's rewards on the reader env (ARENA §3.3).

ARENA: Ren et al., "Effective and Transparent RAG: Adaptive-Reward Reinforcement Learning for
Decision Traceability", arXiv:2505.13258.

Total = format + accuracy + relevance + bonus: format 1 if ``<relevance>``, ``<analysis>``,
``<answer>`` appear in that order; accuracy the normalised EM of the answer; relevance 1 if the
predicted reference set equals the gold set, 0.5 on a partial overlap, 0 on none; bonus +10
when the other three are all 1.

>>> import gymnasium as gym, rag_gym
>>> from rag_gym.envs import ReaderEnv
>>> env = gym.make("rag_gym/SynthHop-Reader-v0", dataset_kwargs={"n_passages": 2000, "n_questions": [40, 10, 10]})
>>> env = ArenaBonus(RelevanceReward(ReaderAccuracyReward(ReaderFormatReward(env))))
>>> obs, info = env.reset(seed=0)
>>> gold = env.unwrapped.current_example.answer
>>> obs, reward, *_ = env.step(ReaderEnv.format_action(info["gold_references"], "...", gold))
>>> reward  # the env's own EM (1) + format 1 + accuracy 1 + relevance 1 + bonus 10
14.0
"""

from __future__ import annotations

import gymnasium as gym

from rag_gym.envs.reader import ReaderEnv
from rag_gym.rewards import core
from rag_gym.wrappers.base import RewardTerm
from rag_gym.wrappers.presets import PRESETS, RewardPreset


class ReaderFormatReward(RewardTerm):
    """Format: 1 if the three tags appear in order (each counted at its first occurrence)."""

    name = "format"

    def term(self, action, obs, terminated, truncated, info) -> float:
        first: list[str] = []
        for name in info.get("tags", []):
            if name not in first:
                first.append(name)
        return core.arena_format(first)


class ReaderAccuracyReward(RewardTerm):
    """Accuracy: normalised exact match of the ``<answer>`` text (1/0)."""

    name = "accuracy"

    def term(self, action, obs, terminated, truncated, info) -> float:
        return core.arena_accuracy(
            info.get("prediction"), self.env.unwrapped.current_example.answers
        )


class RelevanceReward(RewardTerm):
    """Relevance: 1 for the exact gold reference set, 0.5 for a partial overlap, 0 for none."""

    name = "relevance"

    def term(self, action, obs, terminated, truncated, info) -> float:
        return core.arena_relevance(info.get("relevance", []), info.get("gold_references", []))


class ArenaBonus(RewardTerm):
    """Bonus: +10 when format, accuracy and relevance are all 1 (needs the three wrappers beneath)."""

    name = "bonus"

    def __init__(self, env: gym.Env, weight: float = 1.0, bonus: float = 10.0) -> None:
        super().__init__(env, weight=weight, bonus=bonus)
        self.bonus = float(bonus)

    def term(self, action, obs, terminated, truncated, info) -> float:
        raw = info.get("reward_raw", {})
        missing = [k for k in ("format", "accuracy", "relevance") if k not in raw]
        if missing:
            raise RuntimeError(
                f"ArenaBonus needs {missing} beneath it (ReaderFormatReward, ReaderAccuracyReward, "
                "RelevanceReward)"
            )
        return core.arena_bonus(raw["format"], raw["accuracy"], raw["relevance"], self.bonus)


def _preset(env: gym.Env, *, t_max: int | None = None) -> gym.Env:
    """format + accuracy + relevance + 10·bonus (ARENA §3.3)."""
    env = ReaderFormatReward(env)
    env = ReaderAccuracyReward(env)
    env = RelevanceReward(env)
    return ArenaBonus(env)


PRESETS.register(
    "arena",
    RewardPreset(
        _preset,
        ReaderEnv,
        agent="arena",
        recipe={
            "env_id": "rag_gym/SynthHop-Reader-v0",
            "reward_preset": "arena",
            "algorithm": "grpo",
            "num_generations": 7,
            "temperature": 0.9,
            "learning_rate": 3e-6,
            "beta": 0.04,
            "epsilon": 0.2,
            "kl_estimator": "stabilized",
            "max_turns": 1,
            "max_turn_tokens": 512,
            "exp_name": "arena_grpo",
        },
    ),
    origin="rag-gym",
)

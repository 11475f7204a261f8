"""R²AG's Top-Survivor rewards on the tree env (R²AG §2.4 eq. 5, appendix B.2).

R²AG: "R²AG: Learning to Reason, Retrieve, and Self-Evolve through a Multi-Branch Retrieval
Tree" (anonymous submission under review, no arXiv id).

``R = α R_MH + β R_JH + γ R_AP + ω R_f`` per expansion step, α = 0.2, β = 0.3, γ = 0.2,
ℓ = 1.25, ω R_f ≤ 0.02, and the whole reward is 0 when the ``<think>`` block is missing, when
stop is signalled before all gold is found, or when the output was truncated at the length
limit (:class:`R2AGGate`). Each term's default ``weight`` is the paper's coefficient.

>>> import gymnasium as gym, rag_gym
>>> from rag_gym.envs import TreeSearchEnv
>>> env = gym.make("rag_gym/SynthHop-Tree-v0", dataset_kwargs={"n_passages": 2000, "n_questions": [40, 10, 10]})
>>> env = R2AGGate(TreeFormatReward(TopTAPReward(JointHitReward(MultiHitReward(env)))))
>>> obs, info = env.reset(seed=0)
>>> _, reward, *_, info = env.step("<base-Q>no think block</base-Q>")
>>> reward, info["r2ag_gated"]
(0.0, True)
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from rag_gym.envs.tree import TreeSearchEnv
from rag_gym.rewards import core
from rag_gym.wrappers.base import RewardTerm
from rag_gym.wrappers.presets import PRESETS, RewardPreset


class MultiHitReward(RewardTerm):
    """Multi-Hit@Top-1: ``R_MH = R_MH^b + ℓ R_MH^p`` (ℓ = 1.25), the newly retrieved gold
    documents of this step's base and predicted branches; weight α = 0.2."""

    name = "multi_hit"

    def __init__(
        self, env: gym.Env, weight: float = core.R2AG_ALPHA, ell: float = core.R2AG_ELL
    ) -> None:
        super().__init__(env, weight=weight, ell=ell)
        self.ell = float(ell)

    def term(self, action, obs, terminated, truncated, info) -> float:
        return core.r2ag_multi_hit(
            info.get("new_gold_base", 0), info.get("new_gold_predicted", 0), self.ell
        )


class JointHitReward(RewardTerm):
    """Joint-Hit@Top-1: ``R_JH = 1{all gold retrieved and stop}``; weight β = 0.3."""

    name = "joint_hit"

    def __init__(self, env: gym.Env, weight: float = core.R2AG_BETA) -> None:
        super().__init__(env, weight=weight)

    def term(self, action, obs, terminated, truncated, info) -> float:
        return core.r2ag_joint_hit(info.get("all_gold_found", False), info.get("stop", False))


class TopTAPReward(RewardTerm):
    """Top-t/x AP: ``R_AP = R_AP^b + R_AP^p``, AP over the first t base (4) and predicted (2)
    branches, normalised by |g| (the tree env computes both); weight γ = 0.2."""

    name = "top_t_ap"

    def __init__(self, env: gym.Env, weight: float = core.R2AG_GAMMA) -> None:
        super().__init__(env, weight=weight)

    def term(self, action, obs, terminated, truncated, info) -> float:
        return float(info.get("ap_base", 0.0)) + float(info.get("ap_predicted", 0.0))


class TreeFormatReward(RewardTerm):
    """R_f: 0.01 per ``<base-Q>``/``<predicted-Q>`` block following a ``<think>`` block, at most
    0.02 (ω = 1)."""

    name = "format"

    def term(self, action, obs, terminated, truncated, info) -> float:
        return core.r2ag_format(info.get("blocks_after_think", 0))


class R2AGGate(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """Zero the whole step reward when there is no ``<think>`` block, when stop comes before all
    gold is found, or when the output was truncated (``info["output_truncated"]``: the text
    exceeded the env's ``max_action_chars``, R²AG's length limit). ``info["r2ag_gated"]`` says
    whether it fired; ``reward_raw`` keeps the raw terms."""

    def __init__(self, env: gym.Env) -> None:
        gym.utils.RecordConstructorArgs.__init__(self)
        gym.Wrapper.__init__(self, env)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        obs, info = self.env.reset(seed=seed, options=options)
        return obs, {**info, "r2ag_gated": False}

    def step(self, action: Any):
        obs, reward, terminated, truncated, info = self.env.step(action)
        keep = core.r2ag_gate(
            info.get("think_ok", False),
            info.get("premature_stop", False),
            info.get("output_truncated", False),
        )
        info = {**info, "r2ag_gated": not keep}
        if not keep:
            info["reward_terms"] = {k: 0.0 for k in info.get("reward_terms", {})}
            reward = 0.0
        return obs, float(reward), terminated, truncated, info


def _preset(env: gym.Env, *, t_max: int | None = None) -> gym.Env:
    """``0.2 R_MH + 0.3 R_JH + 0.2 R_AP + R_f``, gated (R²AG eq. 5, appendix B.2)."""
    env = MultiHitReward(env)
    env = JointHitReward(env)
    env = TopTAPReward(env)
    env = TreeFormatReward(env)
    return R2AGGate(env)


PRESETS.register(
    "r2ag",
    RewardPreset(
        _preset,
        TreeSearchEnv,
        agent="r2ag",
        recipe={
            "env_id": "rag_gym/SynthHop-Tree-v0",
            "reward_preset": "r2ag",
            "algorithm": "dapo",
            "num_generations": 12,
            "epsilon": 0.2,
            "epsilon_high": 0.28,
            "beta": 0.0,
            "learning_rate": 1e-6,
            "max_turns": 1,
            "max_turn_tokens": 4096,
            "max_completion_tokens": 4096,
            "exp_name": "r2ag_dapo",
        },
    ),
    origin="rag-gym",
)

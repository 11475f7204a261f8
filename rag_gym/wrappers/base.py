"""The reward-wrapper base: one term per wrapper, recorded in ``info``.

A :class:`RewardTerm` computes one raw value per step, stores it in
``info["reward_raw"][name]``, adds ``weight * value`` to the reward and records that
contribution in ``info["reward_terms"][name]``, so ``sum(info["reward_terms"].values())`` stays
the step's reward. Wrappers inherit :class:`gymnasium.utils.RecordConstructorArgs`, so a
wrapper stack is part of the env spec.

:class:`DropBaseReward` removes the env's own reward (its ``reward_terms`` move to
``reward_raw`` under ``base/…``), for presets whose total is exactly a paper's formula.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym


def find_wrapper(env: gym.Env, cls: type) -> gym.Env | None:
    """The first wrapper of type ``cls`` below (or at) ``env``, else None."""
    while isinstance(env, gym.Wrapper):
        if isinstance(env, cls):
            return env
        env = env.env
    return None


class DuplicateRewardTerm(ValueError):
    """A reward term wrapped around an env whose reward already has a term of that name."""


def record(info: dict[str, Any], name: str, raw: float, contribution: float) -> dict[str, Any]:
    """A copy of ``info`` with ``name``'s raw value and reward contribution recorded."""
    info = dict(info)
    info["reward_raw"] = {**info.get("reward_raw", {}), name: float(raw)}
    info["reward_terms"] = {**info.get("reward_terms", {}), name: float(contribution)}
    return info


class RewardTerm(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """Base class: subclasses set ``name`` and implement :meth:`term` (and :meth:`on_reset`)."""

    name: str = "term"

    def __init__(self, env: gym.Env, weight: float = 1.0, **kwargs: Any) -> None:
        if not isinstance(weight, (int, float)) or isinstance(weight, bool):
            raise TypeError(f"expected weight to be a number, got {weight!r}")
        below = env
        while isinstance(below, gym.Wrapper):  # one record per name in info["reward_terms"]
            if isinstance(below, RewardTerm) and below.name == self.name:
                raise DuplicateRewardTerm(
                    f"the term {self.name!r} is already in the reward ({type(below).__name__} "
                    "beneath it): its record in info['reward_terms'] would hide the other's; "
                    "leave one of them out"
                )
            below = below.env
        gym.utils.RecordConstructorArgs.__init__(self, weight=weight, **kwargs)
        gym.Wrapper.__init__(self, env)
        self.weight = float(weight)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        obs, info = self.env.reset(seed=seed, options=options)
        self.on_reset(obs, info)
        return obs, record(info, self.name, 0.0, 0.0)

    def step(self, action: Any):
        obs, reward, terminated, truncated, info = self.env.step(action)
        value = float(self.term(action, obs, terminated, truncated, info))
        contribution = self.weight * value
        return (
            obs,
            float(reward) + contribution,
            terminated,
            truncated,
            record(info, self.name, value, contribution),
        )

    def on_reset(self, obs: Any, info: dict[str, Any]) -> None:
        """Clear per-episode state."""

    def term(
        self, action: Any, obs: Any, terminated: bool, truncated: bool, info: dict[str, Any]
    ) -> float:
        raise NotImplementedError


class DropBaseReward(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """Zero the wrapped env's reward; its terms move to ``info["reward_raw"]["base/<name>"]``.

    Presets put this innermost so their total is exactly the paper's formula (the env's own
    terminal EM would otherwise count twice).
    """

    def __init__(self, env: gym.Env) -> None:
        gym.utils.RecordConstructorArgs.__init__(self)
        gym.Wrapper.__init__(self, env)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        obs, info = self.env.reset(seed=seed, options=options)
        return obs, self._move(info)

    def step(self, action: Any):
        obs, _, terminated, truncated, info = self.env.step(action)
        return obs, 0.0, terminated, truncated, self._move(info)

    @staticmethod
    def _move(info: dict[str, Any]) -> dict[str, Any]:
        info = dict(info)
        base = info.get("reward_terms", {})
        info["reward_raw"] = {
            **info.get("reward_raw", {}),
            **{f"base/{k}": float(v) for k, v in base.items()},
        }
        info["reward_terms"] = {}
        return info


def horizon(env: gym.Env, t_max: int | None) -> int:
    """T_max: the argument, else the env spec's ``max_episode_steps``, else 20 (EVO-RAG §3.6)."""
    if t_max is not None:
        if not isinstance(t_max, int) or t_max < 1:
            raise ValueError(f"expected t_max >= 1, got {t_max!r}")
        return t_max
    spec = getattr(env, "spec", None)
    steps = getattr(spec, "max_episode_steps", None) if spec is not None else None
    return int(steps) if steps else 20

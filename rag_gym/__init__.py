"""rag-gym: the Gymnasium of multi-hop retrieval QA.

``import rag_gym`` registers the environments, so ``gym.make("rag_gym/SynthHop-v0")`` works;
``rag_gym.make(id, reward_preset=..., extra_terms=..., text_actions=...)`` builds the stack.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

from rag_gym.envs.registration import register_envs as _register_envs

_register_envs()


def make(env_id: Any, reward_preset: str = "none", **kwargs: Any) -> Any:
    """:func:`rag_gym.wrappers.presets.make`: ``gym.make(env_id, **kwargs)`` in the stack of
    ``reward_preset``, ``reward_kwargs``, ``max_episode_steps``, ``extra_terms``, ``text_actions``."""
    from rag_gym.wrappers.presets import make as make_with_preset

    return make_with_preset(env_id, reward_preset=reward_preset, **kwargs)

"""What one OpenEnv server serves: :class:`ServerConfig`, and :func:`config_from_environ` (how a
container is configured).

:mod:`rag_gym.integrations.openenv_server` serves it and re-exports both names; this module
needs nothing but rag-gym (the server imports openenv).

>>> cfg = ServerConfig("rag_gym/SynthHop-v0", env_kwargs={"dataset_kwargs": {"n_passages": 2000, "n_questions": [40, 10, 10]}})
>>> cfg.max_concurrent_envs
64
>>> ServerConfig("rag_gym/SynthHop-v9")
Traceback (most recent call last):
...
ValueError: expected a rag-gym env id in [...], got 'rag_gym/SynthHop-v9'; did you mean 'rag_gym/SynthHop-v0'?
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

from rag_gym.envs.tags import tag_set
from rag_gym.integrations._common import check_env_id, check_json_dict
from rag_gym.wrappers.presets import check_preset
from rag_gym.wrappers.presets import make as make_with_preset


@dataclass
class ServerConfig:
    """What one OpenEnv server serves."""

    env_id: str = "rag_gym/SynthHop-v0"
    """A registered id (``rag_gym/SynthHop-v0``, ``rag_gym/HotpotQA-v0``, ...)."""
    reward_preset: str | None = None
    """A reward preset of :mod:`rag_gym.wrappers.presets` (``None``: the env's own reward)."""
    reward_kwargs: dict[str, Any] = field(default_factory=dict)
    """The preset's options (JSON values)."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of ``gym.make`` (JSON values, e.g. ``{"data_path": ...}``)."""
    tags: str | None = None
    """The tag preset of the text form an episode plays by default (``None``: the Dict form)."""
    max_concurrent_envs: int = 64
    """Most WebSocket sessions at once."""
    token: str | None = None
    """A token every request needs (``None`` or ``""``: none)."""

    def __post_init__(self) -> None:
        check_env_id(self.env_id)
        if self.reward_preset is not None:
            check_preset(self.reward_preset)
        self.reward_kwargs = check_json_dict("reward_kwargs", self.reward_kwargs)
        self.env_kwargs = check_json_dict("env_kwargs", self.env_kwargs)
        for key in ("reward_preset", "reward_kwargs"):
            if key in self.env_kwargs:
                raise ValueError(f"give {key} as its own option, not inside env_kwargs")
        if self.tags is not None:
            tag_set(self.tags)  # ValueError with "did you mean" for an unknown preset
        if (
            isinstance(self.max_concurrent_envs, bool)
            or not isinstance(self.max_concurrent_envs, int)
            or self.max_concurrent_envs < 1
        ):
            raise ValueError(
                f"expected max_concurrent_envs to be an int >= 1, got {self.max_concurrent_envs!r}"
            )
        if self.token is not None and not isinstance(self.token, str):
            raise TypeError(f"expected token to be a str or None, got {type(self.token).__name__}")

    def make(self) -> gym.Env:
        """The env one session plays: ``rag_gym.make(env_id, reward_preset=..., **env_kwargs)``
        (the preset's stack outside the registered ``TimeLimit``)."""
        return make_with_preset(
            self.env_id,
            self.reward_preset or "none",
            dict(self.reward_kwargs) if self.reward_kwargs else None,
            **self.env_kwargs,
        )


def config_from_environ(environ: dict[str, str] | None = None) -> ServerConfig:
    """A :class:`ServerConfig` from environment variables (how a container is configured):
    ``RAG_GYM_ENV``, ``RAG_GYM_REWARD_PRESET``, ``RAG_GYM_REWARD_KWARGS`` and
    ``RAG_GYM_ENV_KWARGS`` (JSON objects), ``RAG_GYM_TAGS``, ``RAG_GYM_MAX_SESSIONS``,
    ``RAG_GYM_TOKEN``.

    >>> config_from_environ({"RAG_GYM_ENV": "rag_gym/SynthHop-Hard-v0", "RAG_GYM_MAX_SESSIONS": "128"}).max_concurrent_envs
    128
    >>> config_from_environ({"RAG_GYM_ENV_KWARGS": "{k: 5}"})
    Traceback (most recent call last):
    ...
    ValueError: expected RAG_GYM_ENV_KWARGS to be a JSON object, got '{k: 5}' (Expecting property name enclosed in double quotes: line 1 column 2 (char 1))
    """
    env = os.environ if environ is None else environ

    def obj(name: str) -> dict[str, Any]:
        raw = env.get(name)
        if not raw:
            return {}
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValueError(f"expected {name} to be a JSON object, got {raw!r} ({exc})") from None
        if not isinstance(value, dict):
            raise ValueError(f"expected {name} to be a JSON object, got {raw!r}")
        return value

    sessions = env.get("RAG_GYM_MAX_SESSIONS", "64")
    if not sessions.isdigit():
        raise ValueError(f"expected RAG_GYM_MAX_SESSIONS to be an int >= 1, got {sessions!r}")
    return ServerConfig(
        env_id=env.get("RAG_GYM_ENV", "rag_gym/SynthHop-v0"),
        reward_preset=env.get("RAG_GYM_REWARD_PRESET") or None,
        reward_kwargs=obj("RAG_GYM_REWARD_KWARGS"),
        env_kwargs=obj("RAG_GYM_ENV_KWARGS"),
        tags=env.get("RAG_GYM_TAGS") or None,
        max_concurrent_envs=int(sessions),
        token=env.get("RAG_GYM_TOKEN") or None,
    )

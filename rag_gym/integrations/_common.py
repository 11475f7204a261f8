"""What the integrations share: checking an env id, making an env, JSON-safe ``info``."""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np

from rag_gym._names import unknown_name


def check_env_id(env_id: Any) -> str:
    """``env_id`` if it is a registered rag-gym id; else a typed error with "did you mean"."""
    import rag_gym  # noqa: F401  (registers the ids)

    if not isinstance(env_id, str):
        raise TypeError(f"expected an env id (str), got {type(env_id).__name__}")
    known = [k for k in gym.registry if k.startswith("rag_gym/")]
    if env_id not in known:
        raise unknown_name("rag-gym env id", env_id, known)
    return env_id


def check_json_dict(name: str, value: Any) -> dict[str, Any]:
    """``value`` if it is a dict with string keys (registration kwargs are plain JSON)."""
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise TypeError(f"expected {name} to be a dict with str keys, got {value!r}")
    return dict(value)


def json_safe(value: Any) -> Any:
    """``value`` as plain JSON values: numpy arrays and scalars become lists and numbers, tuples
    and sets lists, enums their names, non-finite floats ``None`` and anything else its ``str``.

    >>> json_safe({"mask": np.array([1, 0], dtype=np.int8), "x": np.float32(0.5), "bad": float("nan")})
    {'mask': [1, 0], 'x': 0.5, 'bad': None}
    """
    if value is None or isinstance(value, (bool, str, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((json_safe(v) for v in value), key=repr)
    if isinstance(value, np.ndarray):
        return json_safe(value.tolist())
    if isinstance(value, np.generic):
        return json_safe(value.item())
    if hasattr(value, "name") and hasattr(type(value), "__members__"):  # an Enum
        return value.name
    return str(value)

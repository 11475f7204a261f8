"""Config fields a command line gives as JSON text.

The trainer configs are parsed by TRL's ``TrlParser`` (transformers' ``HfArgumentParser``) in the
examples, which turns a field typed ``dict | str | None`` into a string option, as TRL's own
configs do for ``model_init_kwargs``. These helpers turn that text back into the value.

>>> dict_option("env_kwargs", '{"k": 3}'), dict_option("env_kwargs", None)
({'k': 3}, {})
>>> dict_option("env_kwargs", "k=3")
Traceback (most recent call last):
...
TypeError: expected env_kwargs to be a dict or a JSON object such as '{"k": 5}', got 'k=3'
"""

from __future__ import annotations

import json
from typing import Any


def json_option(name: str, value: Any, example: str) -> Any:
    """``value`` parsed as JSON when it is a string (else as it is); a string that is not JSON
    raises ``TypeError`` naming the field and an ``example``."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        raise TypeError(f"expected {name} to be JSON such as {example}, got {value!r}") from None


def dict_option(name: str, value: Any) -> dict[str, Any]:
    """A dict field: a dict, a JSON object string, or ``None`` (an empty dict)."""
    if value is None:
        return {}
    parsed = value
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError:
            parsed = None
    if not isinstance(parsed, dict):
        raise TypeError(
            f"expected {name} to be a dict or a JSON object such as '{{\"k\": 5}}', got {value!r}"
        )
    return parsed

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


def parse_config(cls: type, argv: list[str] | None = None, description: str | None = None) -> Any:
    """An instance of the config dataclass ``cls`` from command-line options, one per field
    (``--field-name``; a bool field is ``--field-name`` / ``--no-field-name``; each field's
    ``metadata["help"]`` is its help), as TRL's ``TrlParser`` reads the trainer configs, for
    scripts that do not need transformers. Only ``bool``, ``int``, ``float`` and ``str`` fields
    are parsed; any other field type raises ``TypeError`` naming it.

    >>> from dataclasses import dataclass, field
    >>> @dataclass
    ... class Cfg:
    ...     seed: int = 1
    ...     track: bool = field(default=False, metadata={"help": "log to W&B"})
    >>> parse_config(Cfg, ["--seed", "3", "--track"])
    Cfg(seed=3, track=True)
    """
    import argparse
    import dataclasses
    import typing

    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"expected a dataclass, got {cls!r}")
    hints = typing.get_type_hints(cls)
    parser = argparse.ArgumentParser(description=description)
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        flag = "--" + f.name.replace("_", "-")
        helptext = f.metadata.get("help")
        if kind is bool:
            parser.add_argument(
                flag, action=argparse.BooleanOptionalAction, default=f.default, help=helptext
            )
        elif kind in (int, float, str):
            parser.add_argument(flag, type=kind, default=f.default, help=helptext)
        else:
            raise TypeError(
                f"{cls.__name__}.{f.name}: expected bool, int, float or str, got {kind}"
            )
    return cls(**vars(parser.parse_args(argv)))

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


def parse_json_text(name: str, text: str) -> Any:
    """``json.loads(text)`` for the option ``name``; JSON that Python cannot read, though
    valid, is a ``ValueError`` naming the option: nesting deeper than the parser goes, or an
    integer longer than Python converts (4,300 digits). Invalid JSON raises
    ``json.JSONDecodeError`` as ``json.loads`` does.

    >>> parse_json_text("--env-kwargs", "[" * 100_000)
    Traceback (most recent call last):
    ...
    ValueError: expected --env-kwargs to be JSON nested less deeply: it is too deep to parse
    """
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise
    except RecursionError:
        raise ValueError(
            f"expected {name} to be JSON nested less deeply: it is too deep to parse"
        ) from None
    except ValueError as exc:  # Python's limit on the digits of an integer
        raise ValueError(
            f"expected {name} to hold numbers of at most 4,300 digits ({exc})"
        ) from None


def json_option(name: str, value: Any, example: str) -> Any:
    """``value`` parsed as JSON when it is a string (else as it is); a string that is not JSON
    raises ``TypeError`` naming the field and an ``example`` (JSON too deep or with too long an
    integer, a ``ValueError``: :func:`parse_json_text`)."""
    if not isinstance(value, str):
        return value
    try:
        return parse_json_text(name, value)
    except json.JSONDecodeError:
        raise TypeError(
            f"expected {name} to be JSON such as {example}, got {value[:200]!r}"
        ) from None


def dict_option(name: str, value: Any) -> dict[str, Any]:
    """A dict field: a dict, a JSON object string, or ``None`` (an empty dict)."""
    if value is None:
        return {}
    parsed = value
    if isinstance(value, str):
        try:
            parsed = parse_json_text(name, value)
        except json.JSONDecodeError:
            parsed = None
    if not isinstance(parsed, dict):
        shown = repr(value) if len(repr(value)) <= 200 else repr(value)[:197] + "..."
        raise TypeError(
            f"expected {name} to be a dict or a JSON object such as '{{\"k\": 5}}', got {shown}"
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

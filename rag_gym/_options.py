"""Command-line options made from config dataclass fields: one declaration per option.

A config's field is the option: its name (or a shorter flag the command gives it), its default,
its type and its help, which is the field's docstring as plain text. :func:`with_options` puts
the options of one or more configs into a Typer command's signature, and hands the command the
values given, per config, as a dict of field names.

>>> from rag_gym.evaluate import EvalConfig
>>> field_help(EvalConfig, "n")
'Questions to sample (all of them when the split is smaller).'
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import itertools
import re
import textwrap
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any

#: option types as Typer takes them; a field of another type gets a text option (JSON for a
#: dict or for a union that takes text, a comma-separated list for a tuple of strings) or must
#: be left out of the command
_SCALARS = (str, int, float, bool, Path)


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """The docstring written under each field of the dataclass ``cls`` (and its bases)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass is object or not dataclasses.is_dataclass(klass):
            continue
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):  # no source (a dataclass made at run time)
            continue
        body = ast.parse(source).body[0].body
        for node, after in itertools.pairwise(body):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[node.target.id] = inspect.cleandoc(after.value.value)
    return docs


_ROLE = re.compile(r":[a-z]+:`~?([^`<]*?)(?:\s*<[^>]*>)?`")


def plain(text: str) -> str:
    """reStructuredText as a terminal shows it: roles as their last name (``:class:`~a.B```
    as ``B``), literals without their backquotes, lines joined.

    >>> plain(":func:`~rag_gym.data.load` takes ``name``\\n(see :mod:`rag_gym.data`).")
    'load takes name (see rag_gym.data).'
    """

    def name(match: re.Match) -> str:
        target = match.group(1).strip()
        return target.rsplit(".", 1)[-1] if match.group(0).count("~") else target

    text = _ROLE.sub(name, text).replace("``", "")
    return " ".join(text.split())


def field_help(cls: type, name: str) -> str:
    """The help of the option that sets ``cls``'s field ``name``: its docstring, as plain text."""
    doc = field_docs(cls).get(name)
    if doc is None:
        raise TypeError(f"{cls.__name__}.{name} has no docstring: write one under the field")
    return plain(doc)


@dataclasses.dataclass(frozen=True)
class Options:
    """The options a command takes from the config ``cls``: every field but ``exclude``, or
    ``only`` those; ``flags`` gives a field another option name (``{"n_demos": "demos"}``:
    ``--demos``); ``prefix`` goes before each help text (``"SFT: "``)."""

    cls: type
    flags: Mapping[str, str] = dataclasses.field(default_factory=dict)
    exclude: frozenset[str] = frozenset()
    only: tuple[str, ...] | None = None
    prefix: str = ""

    def fields(self) -> list[dataclasses.Field]:
        chosen = [f for f in dataclasses.fields(self.cls) if f.name not in self.exclude]
        if self.only is not None:
            by_name = {f.name: f for f in chosen}
            chosen = [by_name[name] for name in self.only]
        return chosen

    def option(self, name: str) -> str:
        """The parameter name of field ``name``'s option (``--`` and dashes make the flag)."""
        return self.flags.get(name, name)


def default_of(field: dataclasses.Field) -> Any:
    """The field's default (``inspect.Parameter.empty`` for none: a required option)."""
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return inspect.Parameter.empty


#: a config class's field types, read once per class
_hints = functools.cache(typing.get_type_hints)


def _option_type(owner: type, field: dataclasses.Field) -> tuple[Any, Callable[[Any], Any]]:
    """The type Typer parses a field's option as, and the conversion of its value back to the
    field's."""
    hint = _hints(owner)[field.name]
    args = set(typing.get_args(hint)) if isinstance(hint, types.UnionType) else {hint}
    optional = type(None) in args
    args.discard(type(None))
    if len(args) == 1 and next(iter(args)) in _SCALARS:
        (kind,) = args
        return (kind | None if optional else kind), lambda value: value
    if dict in {typing.get_origin(a) or a for a in args} or str in args:
        return str | None, lambda value: value  # JSON (or other) text the config parses
    if hint == tuple[str, ...]:
        return str, lambda value: tuple(x.strip() for x in value.split(",") if x.strip())
    raise TypeError(
        f"{owner.__name__}.{field.name} ({hint}) has no command-line form: leave it out of the "
        "command (Options.exclude)"
    )


def _cli_default(field: dataclasses.Field, kind: Any) -> Any:
    default = default_of(field)
    if kind is str and isinstance(default, tuple):
        return ",".join(default)
    if kind == str | None and isinstance(default, dict | tuple):
        return default or None
    return default


def parameters(options: Options) -> list[inspect.Parameter]:
    """The keyword parameters of ``options``' fields, annotated as Typer options."""
    import typer

    out = []
    for field in options.fields():
        kind, _ = _option_type(options.cls, field)
        help_text = options.prefix + field_help(options.cls, field.name)
        out.append(
            inspect.Parameter(
                options.option(field.name),
                inspect.Parameter.KEYWORD_ONLY,
                default=_cli_default(field, kind),
                annotation=Annotated[kind, typer.Option(help=help_text)],
            )
        )
    return out


def with_options(**groups: Options) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a command the options of each group's config: the command's parameter named after
    the group receives the field values (``{field: value}``, every field of the group, as
    given or by default); its other parameters are its own options.

    The command must not also declare a parameter an option of a group takes."""

    def wrap(command: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(command)
        own = [p for name, p in signature.parameters.items() if name not in groups]
        made = {key: parameters(options) for key, options in groups.items()}
        names = [p.name for p in own] + [p.name for params in made.values() for p in params]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise TypeError(f"{command.__name__}: options declared twice: {', '.join(twice)}")

        # per group: each field, the option that sets it, and its value's conversion
        fields = {
            key: [
                (f.name, options.option(f.name), _option_type(options.cls, f)[1])
                for f in options.fields()
            ]
            for key, options in groups.items()
        }

        @functools.wraps(command)
        def run(**given: Any) -> Any:
            values = {
                key: {name: convert(given.pop(option)) for name, option, convert in group}
                for key, group in fields.items()
            }
            return command(**given, **values)

        ordered = own + [p for params in made.values() for p in params]
        keyword = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in ordered]
        run.__signature__ = signature.replace(parameters=keyword)
        run.__options__ = dict(groups)  # what each group's options are made from
        return run

    return wrap

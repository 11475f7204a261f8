"""Checking a name against the known ones, with "did you mean …" (one helper for the package)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def unknown_name(
    what: str, name: object, known: Iterable[str], aliases: Iterable[str] = ()
) -> ValueError:
    """The ``ValueError`` for an unknown ``name``: "expected a <what> in [...], got 'x'; did you mean 'y'?".

    >>> str(unknown_name("dataset", "musiqe", ["musique", "hotpotqa"]))
    "expected a dataset in ['hotpotqa', 'musique'], got 'musiqe'; did you mean 'musique'?"
    """
    known = sorted(known)
    close = difflib.get_close_matches(str(name), [*known, *aliases], n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return ValueError(f"expected a {what} in {known}, got {name!r}{hint}")

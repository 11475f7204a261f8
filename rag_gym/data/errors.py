"""Typed errors for data files."""

from __future__ import annotations

from pathlib import Path
from typing import Any


class DataFormatError(ValueError):
    """A data file that does not match its format.

    The message names the file, the record (``line 12`` or ``record 3``), the field, what was
    expected and what was found, so the user can open the file at the right place.

    >>> str(DataFormatError("dev.json", "record 3", "answer", "a string", 5))
    "dev.json, record 3, field 'answer': expected a string, got 5"
    """

    def __init__(self, path: Path | str, where: str, field: str, expected: str, got: Any) -> None:
        self.path = str(path)
        self.where = where
        self.field = field
        shown = got if isinstance(got, str) and got in _PLAIN else _short(got)
        super().__init__(f"{path}, {where}, field {field!r}: expected {expected}, got {shown}")


_PLAIN = (
    "it is missing",
    "neither",
    "no records",
    "no file of that split",
)  # shown as words, not as repr


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."

"""File reading shared by the loaders: JSON, JSONL and parquet records with located errors."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from rag_gym.data.errors import DataFormatError


def iter_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line number, record)`` for each non-blank line; bad JSON names file and line."""
    _check_file(path)
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataFormatError(
                    path, f"line {lineno}", "(json)", "valid JSON", str(exc)
                ) from None
            if not isinstance(record, dict):
                raise DataFormatError(path, f"line {lineno}", "(record)", "a JSON object", record)
            yield lineno, record


def iter_records(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield ``(where, record)`` from a ``.json`` list, ``.jsonl`` or ``.parquet`` file.

    ``where`` is ``"record N"`` (0-based index) for JSON lists and parquet rows, ``"line N"`` for
    JSONL, so an error message points at the right place.
    """
    _check_file(path)
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        for lineno, record in iter_jsonl(path):
            yield f"line {lineno}", record
    elif suffix == ".json":
        with open(path, encoding="utf-8") as f:
            try:
                data = json.load(f)
            except json.JSONDecodeError as exc:
                raise DataFormatError(path, "(file)", "(json)", "valid JSON", str(exc)) from None
        if isinstance(data, dict) and isinstance(data.get("data"), list):
            data = data["data"]
        if not isinstance(data, list):
            raise DataFormatError(
                path, "(file)", "(top level)", "a JSON list of records", type(data).__name__
            )
        for i, record in enumerate(data):
            if not isinstance(record, dict):
                raise DataFormatError(path, f"record {i}", "(record)", "a JSON object", record)
            yield f"record {i}", record
    elif suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as exc:
            raise ImportError(f"reading {path} needs pyarrow: pip install 'rag-gym[hub]'") from exc
        for i, record in enumerate(pq.read_table(path).to_pylist()):
            yield f"record {i}", record
    else:
        raise ValueError(
            f"expected a .json, .jsonl or .parquet file, got {path.name!r}; "
            "convert the file or pass the right path"
        )


def _check_file(path: Path) -> None:
    if not path.exists():
        raise FileNotFoundError(f"no such file: {path}")
    if not path.is_file():
        raise ValueError(f"expected a file, got a directory: {path}; pass the data file itself")


def require(
    record: Mapping[str, Any],
    key: str,
    types: type | tuple[type, ...],
    path: Path | str,
    where: str,
) -> Any:
    """``record[key]`` checked against ``types``; raises DataFormatError naming file, record, field."""
    if key not in record:
        raise DataFormatError(path, where, key, "the field to be present", "it is missing")
    value = record[key]
    types_t = types if isinstance(types, tuple) else (types,)
    if not isinstance(value, types_t) or (isinstance(value, bool) and bool not in types_t):
        expected = " or ".join(t.__name__ for t in types_t)
        raise DataFormatError(path, where, key, f"a {expected}", value)
    return value


def join_sentences(sentences: Sequence[str]) -> str:
    """Join a paragraph's sentences.

    HotpotQA sentences carry their own leading space; 2WikiMultiHopQA's do not. A space is added
    only where the next sentence does not start with whitespace.

    >>> join_sentences(["A b.", " C d."]), join_sentences(["A b.", "C d."])
    ('A b. C d.', 'A b. C d.')
    """
    out = []
    for i, s in enumerate(sentences):
        if i and s and not s[0].isspace():
            out.append(" ")
        out.append(s)
    return "".join(out).strip()

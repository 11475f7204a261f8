"""File reading shared by the loaders: JSON, JSONL and parquet records with located errors.

Every record these helpers yield holds valid Unicode text: a JSON escape of a lone surrogate
(``"\\ud800"``), which ``json`` turns into a Python string that no UTF-8 file or HTTP body can
hold, is refused with a :class:`DataFormatError` naming the file, the record and the field.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from rag_gym.data.errors import DataFormatError
from rag_gym.metrics import normalize_answer


def iter_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line number, record)`` for each non-blank line; bad JSON, bytes that are not
    UTF-8 and nesting too deep to parse name the file and the line."""
    _check_file(path)
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            record = parse_line(raw, path, f"line {lineno}")
            if record is not None:
                yield lineno, record


def parse_line(raw: bytes, path: Path, where: str) -> dict[str, Any] | None:
    """One JSONL line's record (``None`` for a blank line); bad JSON, bytes that are not UTF-8,
    a record that is not an object and lone surrogates name ``path`` and ``where``."""
    line = _decode(raw, path, where)
    if not line.strip():
        return None
    record = parse_json(line, path, where)
    if not isinstance(record, dict):
        raise DataFormatError(path, where, "(record)", "a JSON object", record)
    if _SURROGATE_ESCAPE.search(line):
        check_unicode(record, path, where)
    return record


def parse_json(text: str, path: Path | str, where: str) -> Any:
    """``json.loads(text)``; invalid JSON, an integer longer than Python converts (4,300
    digits) or nesting too deep for the parser raises :class:`DataFormatError` naming ``path``
    and ``where``."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataFormatError(path, where, "(json)", "valid JSON", str(exc)) from None
    except RecursionError:
        raise DataFormatError(
            path, where, "(json)", "JSON nested less deeply", "nesting too deep to parse"
        ) from None
    except ValueError as exc:  # int("1" * 5000): Python's limit on integer digits
        long = re.search(r"\d{4301,}", text)
        if long is not None and where == "(file)":
            where = f"line {text.count(chr(10), 0, long.start()) + 1}"
        raise DataFormatError(
            path, where, "(json)", "numbers of at most 4,300 digits", str(exc)
        ) from None


#: a JSON escape that may stand for a lone surrogate: ``\ud800`` to ``\udfff``
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def check_unicode(record: Any, path: Path | str, where: str) -> None:
    """``DataFormatError`` naming the field (``context[2][1][0]``) of the first string of
    ``record`` (keys included) that holds a lone surrogate."""
    stack: list[tuple[str, Any]] = [("", record)]
    while stack:
        field, value = stack.pop()
        if isinstance(value, str):
            found = _SURROGATE.search(value)
            if found:
                start = max(found.start() - 20, 0)
                raise DataFormatError(
                    path,
                    where,
                    field or "(record)",
                    "valid Unicode text (a JSON escape such as \\ud800 that is not half of a "
                    "surrogate pair is not a character; fix or drop it)",
                    value[start : found.start() + 20],
                )
        elif isinstance(value, dict):
            for key, item in reversed(value.items()):
                name = f"{field}.{key}" if field else str(key)
                stack.append((name, item))
                stack.append((f"{name} (the key)", key))
        elif isinstance(value, list):
            stack.extend((f"{field}[{i}]", item) for i, item in reversed(list(enumerate(value))))


def read_text(path: Path) -> str:
    """The whole file as UTF-8 text; a byte that is not UTF-8 names the file and its line."""
    _check_file(path)
    return _decode(path.read_bytes(), path, None)


def _decode(raw: bytes, path: Path | str, where: str | None) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        if where is None:
            line = raw.count(b"\n", 0, exc.start) + 1
            col = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
            where = f"line {line}"
        else:
            col = exc.start + 1
        raise DataFormatError(
            path,
            where,
            "(encoding)",
            "UTF-8 text",
            f"byte {raw[exc.start : exc.start + 1]!r} at column {col}; re-save the file as UTF-8",
        ) from None


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
        text = read_text(path)
        data = parse_json(text, path, "(file)") if text.strip() else []  # blank: no records
        check = _SURROGATE_ESCAPE.search(text) is not None
        if isinstance(data, dict) and isinstance(data.get("data"), list):
            data = data["data"]
        if not isinstance(data, list):
            raise DataFormatError(
                path, "(file)", "(top level)", "a JSON list of records", type(data).__name__
            )
        for i, record in enumerate(data):
            if not isinstance(record, dict):
                raise DataFormatError(path, f"record {i}", "(record)", "a JSON object", record)
            if check:
                check_unicode(record, path, f"record {i}")
            yield f"record {i}", record
    elif suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as exc:
            raise ImportError(f"reading {path} needs pyarrow: pip install 'rag-gym[hub]'") from exc
        try:
            rows = pq.read_table(path).to_pylist()
        except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
            raise DataFormatError(
                path, "(file)", "(parquet)", "a readable parquet file", str(exc)
            ) from None
        for i, record in enumerate(rows):
            yield f"record {i}", record
    else:
        raise ValueError(
            f"expected a .json, .jsonl or .parquet file, got {path.name!r}; "
            "convert the file or pass the right path"
        )


def check_answer(answer: str, path: Path | str, where: str, field: str) -> str:
    """``answer`` if it keeps a word after answer normalisation; a gold answer that normalises
    to nothing (``""``, ``"The"``, ``"a."``) would score every answer made of articles and
    punctuation (``"an"``) as exactly right, so it is a :class:`DataFormatError` naming
    ``path``, ``where`` and ``field``."""
    if not normalize_answer(answer):
        raise DataFormatError(
            path,
            where,
            field,
            "a gold answer that keeps a word after normalisation (lower-case, punctuation and "
            "the articles a/an/the removed): fix the answer or drop the alias",
            answer,
        )
    return answer


def checked_examples(
    path: Path | str, parsed: Iterable[tuple[str, Any]], id_field: str = "id"
) -> list:
    """The examples of ``parsed`` (``(where, QAExample)`` pairs in file order), after the checks
    every loader shares: at least one record, a non-empty question, a non-empty id, gold
    answers that keep a word after normalisation (:func:`check_answer`; the loaders check each
    field first, to name it), and unique ids (a repeated id names both records: the env would
    otherwise keep the last and never pose the first)."""
    examples = []
    first_at: dict[str, str] = {}
    for where, example in parsed:
        if not example.question.strip():
            raise DataFormatError(path, where, "question", "a non-empty question", example.question)
        if not example.id.strip():
            raise DataFormatError(path, where, id_field, "a non-empty id", example.id)
        for answer in example.answers:
            check_answer(answer, path, where, "answers")
        if example.id in first_at:
            raise DataFormatError(
                path,
                f"{first_at[example.id]} and {where}",
                id_field,
                "unique question ids (give one of the two records another id)",
                example.id,
            )
        first_at[example.id] = where
        examples.append(example)
    if not examples:
        raise DataFormatError(path, "(file)", "(records)", "at least one record", "no records")
    return examples


def require_pool(
    passages: Sequence[Any], record: Mapping[str, Any], field: str, path, where
) -> None:
    """A dataset whose questions come with their own paragraphs needs a non-empty ``field``."""
    if not passages:
        raise DataFormatError(
            path, where, field, "a non-empty list of paragraphs", record.get(field, "it is missing")
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

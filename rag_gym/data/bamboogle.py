"""Bamboogle (Press et al., 2023): 125 two-hop questions written to defeat search engines.

Accepted inputs: JSONL (``{id, question, answer}``, as FlashRAG and Search-R1 distribute it,
``golden_answers`` accepted too) and the original TSV/CSV export with ``Question`` and ``Answer``
columns. Bamboogle has no passages: the environment needs a corpus (a JSONL file, an index or a
server) to search.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from rag_gym.data._io import check_answer, checked_examples, iter_records, read_text
from rag_gym.data.errors import DataFormatError
from rag_gym.data.flashrag import parse_record as parse_flashrag
from rag_gym.data.types import QAExample


def load(path: str | Path | None = None, split: str = "test") -> list[QAExample]:
    """Load Bamboogle from a JSONL or TSV/CSV file (hub: FlashRAG's copy when ``path`` is None)."""
    if path is None:
        from rag_gym.data.flashrag import load as load_flashrag

        if split != "test":
            raise ValueError(
                f"expected split 'test' for Bamboogle from the hub (its only split), got {split!r}"
            )
        return [_as_bamboogle(ex) for ex in load_flashrag(None, split="test", subset="bamboogle")]
    path = Path(path)
    if path.suffix.lower() in (".tsv", ".csv"):
        return _load_table(path)
    return checked_examples(
        path,
        (
            (where, _as_bamboogle(parse_flashrag(r, path, where, default_id=f"bamboogle-{i}")))
            for i, (where, r) in enumerate(iter_records(path))
        ),
    )


def _as_bamboogle(ex: QAExample) -> QAExample:
    return QAExample(
        id=ex.id,
        question=ex.question,
        answers=ex.answers,
        hops=2,
        type="compositional",
        meta=ex.meta,
    )


def _load_table(path: Path) -> list[QAExample]:
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {path}")
    delimiter = "\t" if path.suffix.lower() == ".tsv" else ","
    text = read_text(path)
    reader = csv.DictReader(io.StringIO(text, newline=""), delimiter=delimiter)
    header = {(h or "").strip().lower(): h for h in reader.fieldnames or []}
    for col in ("question", "answer"):
        if col not in header:
            raise DataFormatError(path, "line 1", col.capitalize(), "a header column", list(header))
    examples = []
    try:
        rows = list(reader)
    except csv.Error as exc:  # e.g. a field over csv.field_size_limit()
        raise DataFormatError(
            path, f"line {reader.line_num}", "(csv)", "valid CSV/TSV", str(exc)
        ) from None
    for i, row in enumerate(rows):
        q = (row.get(header["question"]) or "").strip()
        a = (row.get(header["answer"]) or "").strip()
        if not q:
            raise DataFormatError(path, f"line {i + 2}", "Question", "a non-empty question", q)
        if not a:
            raise DataFormatError(path, f"line {i + 2}", "Answer", "a non-empty answer", a)
        check_answer(a, path, f"line {i + 2}", "Answer")
        examples.append(
            (
                f"line {i + 2}",
                QAExample(
                    id=f"bamboogle-{i + 1}",
                    question=q,
                    answers=(a,),
                    hops=2,
                    type="compositional",
                ),
            )
        )
    return checked_examples(path, examples)

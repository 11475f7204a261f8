"""2WikiMultiHopQA (Ho et al., 2020): the official JSON files (``train.json``, ``dev.json``).

Records: ``_id, type, question, context [[title, [sentences]]], supporting_facts [[title,
sent_id]], evidences [[subject, relation, object]], answer, entity_ids``. Gold passages are the
supporting-fact paragraphs in the order the file lists them (which follows the evidence chain);
``hops`` is their number (2 for compositional, comparison and inference questions, 4 for
bridge-comparison). ``evidences``, ``entity_ids`` and the supporting sentences (``support``: ``(passage id,
sentence)`` pairs) are kept in ``meta``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rag_gym.data._io import checked_examples, iter_records, require_pool
from rag_gym.data._wiki import parse_common
from rag_gym.data.errors import DataFormatError
from rag_gym.data.types import QAExample


def load(path: str | Path | None = None, split: str = "validation") -> list[QAExample]:
    """Load 2WikiMultiHopQA examples from the official JSON (or JSONL/parquet) file."""
    if path is None:
        raise ValueError(
            "2WikiMultiHopQA has no hub copy in its official format; download the dataset from "
            "https://github.com/Alab-NII/2wikimultihop and pass path='.../dev.json'"
        )
    path = Path(path)
    return checked_examples(
        path, ((where, parse_record(r, path, where)) for where, r in iter_records(path)), "_id"
    )


def parse_record(record: dict[str, Any], path: Path, where: str) -> QAExample:
    qid, question, answers, passages, gold, support = parse_common(record, path, where)
    evidences = record.get("evidences", [])
    if not isinstance(evidences, list):
        raise DataFormatError(
            path, where, "evidences", "a list of [subject, relation, object]", evidences
        )
    require_pool(passages, record, "context", path, where)
    return QAExample(
        id=qid,
        question=question,
        answers=answers,
        supporting_ids=gold,
        passages=passages,
        hops=len(gold) or None,
        answerable=True,
        type=str(record.get("type", "")),
        meta={
            "evidences": evidences,
            "entity_ids": record.get("entity_ids", ""),
            "support": support,
        },
    )

"""FlashRAG's unified JSONL format (Jin et al., 2024), which covers NQ, TriviaQA, PopQA, …

Records: ``{id, question, golden_answers: [...], metadata?}``. There are no passages: pair these
datasets with a corpus. An id is a non-empty string or an integer (``true`` is refused, not read
as ``"True"``); a gold answer that normalises to nothing (``"The"``) is refused, naming the
record and field. With ``path=None`` the file comes from the hub dataset
``RUC-NLPIR/FlashRAG_datasets`` (``subset`` names the dataset, e.g. ``"nq"``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rag_gym.data._io import check_answer, checked_examples, iter_records, require
from rag_gym.data.errors import DataFormatError
from rag_gym.data.types import QAExample

HUB_ID = "RUC-NLPIR/FlashRAG_datasets"
#: The hub's names of rag-gym's splits (FlashRAG calls the validation split ``dev``).
_HUB_SPLITS = {"validation": "dev"}


def load(
    path: str | Path | None = None, split: str = "test", subset: str | None = None
) -> list[QAExample]:
    """Load a FlashRAG-format JSONL file (or ``subset`` of the hub dataset when ``path`` is None)."""
    if path is None:
        if not subset:
            raise ValueError(
                "expected path=... or subset='nq' (a FlashRAG dataset name), got neither"
            )
        from rag_gym.data.hub import load_hub_records

        hub_split = _HUB_SPLITS.get(split, split)
        records = load_hub_records(HUB_ID, subset, hub_split, "FlashRAG")
        src = Path(f"hub:{HUB_ID}/{subset}/{hub_split}")
        return checked_examples(
            src,
            ((f"record {i}", parse_record(r, src, f"record {i}")) for i, r in enumerate(records)),
        )
    path = Path(path)
    return checked_examples(
        path,
        (
            (where, parse_record(r, path, where, default_id=f"{path.stem}-{i}"))
            for i, (where, r) in enumerate(iter_records(path))
        ),
    )


def parse_record(
    record: dict[str, Any], path: Path, where: str, default_id: str | None = None
) -> QAExample:
    qid = record.get("id", default_id)
    if qid is None or isinstance(qid, bool) or not isinstance(qid, (str, int)):
        raise DataFormatError(path, where, "id", "a string or integer id", qid)
    if isinstance(qid, str) and not qid.strip():
        raise DataFormatError(path, where, "id", "a non-empty id", qid)
    question = require(record, "question", str, path, where)
    if "golden_answers" in record:
        answers = record["golden_answers"]
        if isinstance(answers, str):
            answers = [answers]
        if not isinstance(answers, list) or not all(isinstance(a, str) for a in answers):
            raise DataFormatError(path, where, "golden_answers", "a list of strings", answers)
    elif "answer" in record:
        answer = record["answer"]
        if isinstance(answer, list) and all(isinstance(a, str) for a in answer):
            answers = answer
        elif isinstance(answer, str):
            answers = [answer]
        else:
            raise DataFormatError(path, where, "answer", "a string or a list of strings", answer)
    else:
        raise DataFormatError(
            path, where, "golden_answers", "the field to be present", "it is missing"
        )
    field = "golden_answers" if "golden_answers" in record else "answer"
    for i, answer in enumerate(answers):
        check_answer(answer, path, where, f"{field}[{i}]" if len(answers) > 1 else field)
    meta = record.get("metadata") or {}
    return QAExample(
        id=str(qid),
        question=question,
        answers=tuple(dict.fromkeys(a.strip() for a in answers)),
        meta=meta if isinstance(meta, dict) else {"metadata": meta},
    )

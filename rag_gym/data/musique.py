"""MuSiQue (Trivedi et al., 2022): the official JSONL files, MuSiQue-Ans and MuSiQue-Full.

Records: ``id, question, answer, answer_aliases, answerable, paragraphs [{idx, title,
paragraph_text, is_supporting}], question_decomposition [{id, question, answer,
paragraph_support_idx}]``. Passage ids are ``"<question id>::<idx>"`` (MuSiQue paragraphs are
not unique by title). Gold passages follow the decomposition's ``paragraph_support_idx`` (hop
order); paragraphs flagged ``is_supporting`` but not named by the decomposition follow. MuSiQue-Full's
``answerable: false`` questions are kept as unanswerable (a blank ``answer`` there means none);
``answer_aliases`` are kept as answers. A gold answer or alias that normalises to nothing
(``"The"``) is a :class:`~rag_gym.data.errors.DataFormatError` naming the record and field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rag_gym.data._io import (
    check_answer,
    checked_examples,
    iter_records,
    require,
    require_pool,
)
from rag_gym.data.errors import DataFormatError
from rag_gym.data.types import Passage, QAExample


def load(path: str | Path | None = None, split: str = "validation") -> list[QAExample]:
    """Load MuSiQue examples from an official JSONL file."""
    if path is None:
        raise ValueError(
            "MuSiQue has no hub copy in its official format; download it from "
            "https://github.com/StonyBrookNLP/musique and pass path='.../musique_ans_v1.0_dev.jsonl'"
        )
    path = Path(path)
    return checked_examples(
        path, ((where, parse_record(r, path, where)) for where, r in iter_records(path))
    )


def parse_record(record: dict[str, Any], path: Path, where: str) -> QAExample:
    qid = str(require(record, "id", (str, int), path, where))
    question = require(record, "question", str, path, where)
    answer = record.get("answer")
    if answer is not None and not isinstance(answer, str):
        raise DataFormatError(path, where, "answer", "a string", answer)
    aliases = record.get("answer_aliases", [])
    if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
        raise DataFormatError(path, where, "answer_aliases", "a list of strings", aliases)
    answerable = record.get("answerable", True)
    if not isinstance(answerable, bool):
        raise DataFormatError(path, where, "answerable", "true or false", answerable)

    paragraphs = require(record, "paragraphs", list, path, where)
    passages: list[Passage] = []
    by_idx: dict[int, str] = {}
    flagged: list[str] = []
    for j, para in enumerate(paragraphs):
        field = f"paragraphs[{j}]"
        if not isinstance(para, dict):
            raise DataFormatError(path, where, field, "an object", para)
        idx = para.get("idx", j)
        if not isinstance(idx, int):
            raise DataFormatError(path, where, f"{field}.idx", "an integer", idx)
        title = para.get("title", "")
        text = para.get("paragraph_text")
        if not isinstance(title, str):
            raise DataFormatError(path, where, f"{field}.title", "a string", title)
        if not isinstance(text, str):
            raise DataFormatError(path, where, f"{field}.paragraph_text", "a string", text)
        pid = f"{qid}::{idx}"
        if idx in by_idx:
            raise DataFormatError(
                path, where, f"{field}.idx", "an idx no other paragraph of the record has", idx
            )
        by_idx[idx] = pid
        passages.append(Passage(pid, title, text))
        if para.get("is_supporting"):
            flagged.append(pid)

    decomposition = record.get("question_decomposition", [])
    if not isinstance(decomposition, list):
        raise DataFormatError(path, where, "question_decomposition", "a list", decomposition)
    ordered: list[str] = []
    for j, step in enumerate(decomposition):
        if not isinstance(step, dict):
            raise DataFormatError(path, where, f"question_decomposition[{j}]", "an object", step)
        support = step.get("paragraph_support_idx")
        if support is None:
            continue
        if isinstance(support, bool) or not isinstance(support, int) or support not in by_idx:
            raise DataFormatError(
                path,
                where,
                f"question_decomposition[{j}].paragraph_support_idx",
                "the idx of one of the paragraphs",
                support,
            )
        if by_idx[support] not in ordered:
            ordered.append(by_idx[support])
    gold = tuple(ordered + [pid for pid in flagged if pid not in ordered])
    require_pool(passages, record, "paragraphs", path, where)

    if not answerable and answer is not None and not answer.strip():
        answer = None  # an unanswerable question's blank answer: it has none
    if answer is not None:
        check_answer(answer, path, where, "answer")
    for i, alias in enumerate(aliases):
        check_answer(alias, path, where, f"answer_aliases[{i}]")
    answers = tuple(dict.fromkeys(([answer] if answer is not None else []) + aliases))
    return QAExample(
        id=qid,
        question=question,
        answers=answers,
        supporting_ids=gold,
        passages=tuple(passages),
        hops=len(decomposition) or None,
        answerable=answerable,
        type=qid.split("__")[0] if "__" in qid else "",
        meta={"decomposition": decomposition},
    )

"""HotpotQA (Yang et al., 2018): official JSON files and the Hugging Face layout.

Accepted inputs:

* the official JSON list (``hotpot_dev_distractor_v1.json``, ``hotpot_dev_fullwiki_v1.json``,
  ``hotpot_train_v1.1.json``): ``_id, question, answer, type, level, supporting_facts
  [[title, sent_id]], context [[title, [sentences]]]``;
* the Hugging Face ``hotpot_qa`` layout as ``datasets`` yields it, as JSONL or parquet:
  ``id, …, supporting_facts {title[], sent_id[]}, context {title[], sentences[][]}``;
* ``path=None``: the hub itself through ``datasets`` (needs a network and ``rag-gym[hub]``).

Gold passages are the paragraphs named by ``supporting_facts`` (their titles are the passage ids);
HotpotQA does not give hop order, so they keep their order of first appearance. Unlabelled test
files (no ``answer``) load with empty ``answers``. ``meta["support"]`` holds the supporting
sentences as ``(passage id, sentence)`` pairs, ``meta["level"]`` the difficulty level.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rag_gym.data._io import checked_examples, iter_records, require_pool
from rag_gym.data._wiki import parse_common
from rag_gym.data.types import QAExample

HUB_ID = "hotpotqa/hotpot_qa"


def load(
    path: str | Path | None = None, split: str = "validation", setting: str = "distractor"
) -> list[QAExample]:
    """Load HotpotQA examples from ``path`` (or the hub when ``path`` is ``None``)."""
    if path is None:
        from rag_gym.data.hub import load_hub_records

        records = load_hub_records(HUB_ID, setting, split, "HotpotQA")
        src = Path(f"hub:{HUB_ID}/{setting}/{split}")
        return checked_examples(
            src,
            ((f"record {i}", parse_record(r, src, f"record {i}")) for i, r in enumerate(records)),
            "_id",
        )
    path = Path(path)
    return checked_examples(
        path, ((where, parse_record(r, path, where)) for where, r in iter_records(path)), "_id"
    )


def parse_record(record: dict[str, Any], path: Path, where: str) -> QAExample:
    qid, question, answers, passages, gold, support = parse_common(record, path, where)
    require_pool(passages, record, "context", path, where)
    return QAExample(
        id=qid,
        question=question,
        answers=answers,
        supporting_ids=gold,
        passages=passages,
        hops=2,
        answerable=True,
        type=str(record.get("type", "")),
        meta={"level": record.get("level", ""), "support": support},
    )

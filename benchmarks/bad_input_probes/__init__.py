"""The probes of ``benchmarks/bad_inputs.py`` by area, each module with ``probes(tmp)``: its
categories and, for each, (tried, handled cleanly); and what the script and the probes share (a
small SynthHop world, a good record per loader, the writer of a data file)."""

from __future__ import annotations

import json
from pathlib import Path

SMALL = {"n_passages": 2000, "n_questions": [60, 30, 30]}
CTX = [["T", ["s."]], ["U", ["t."]]]
GOOD = {
    "hotpotqa": (
        "h.json",
        {
            "_id": "a",
            "question": "q?",
            "answer": "x",
            "context": CTX,
            "supporting_facts": [["T", 0]],
        },
    ),
    "2wikimultihopqa": (
        "w.json",
        {"_id": "a", "question": "q?", "answer": "x", "context": CTX, "evidences": []},
    ),
    "musique": (
        "m.jsonl",
        {
            "id": "a",
            "question": "q?",
            "answer": "x",
            "answer_aliases": [],
            "paragraphs": [{"idx": 0, "title": "T", "paragraph_text": "p", "is_supporting": True}],
            "question_decomposition": [
                {"question": "s", "answer": "x", "paragraph_support_idx": 0}
            ],
        },
    ),
    "flashrag": ("f.jsonl", {"id": "a", "question": "q?", "golden_answers": ["x"]}),
    "bamboogle": ("b.jsonl", {"id": "a", "question": "q?", "answer": "x"}),
}


def write(path: Path, records) -> None:
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    else:
        path.write_text(json.dumps(records))

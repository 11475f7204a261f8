"""Corpora and queries for the sharded-index tests: a SynthHop world and the HotpotQA sample's
paragraphs as corpus JSONL files, each with at least 2,000 queries."""

from __future__ import annotations

import re
from pathlib import Path

from rag_gym.data import Corpus, Passage, load, pooled_corpus
from rag_gym.data.synthhop import world_for
from tests.conftest import SMALL_WORLD, shared_file


def synthhop_case(folder: Path) -> tuple[Path, list[str], list[list[str]]]:
    """A small SynthHop world's corpus file, 2,000+ queries (questions, their sub-questions,
    passage titles) and, per question, its own passages (pools for ``within``)."""
    world = world_for("default", **SMALL_WORLD)
    path = folder / "synthhop.jsonl"
    world.corpus.to_jsonl(path)
    examples = [ex for split in world.questions.values() for ex in split]
    queries = [ex.question for ex in examples]
    queries += [d["question"] for ex in examples for d in ex.meta.get("decomposition", [])]
    queries += [f"{p.title} {p.text.split('.')[0]}" for p in world.corpus][
        : max(0, 2100 - len(queries))
    ]
    pools = [[p.id for p in ex.passages] for ex in examples]
    return path, queries, pools


def hotpot_case(folder: Path) -> tuple[Path, list[str], list[list[str]]]:
    """The HotpotQA sample's paragraphs (pooled over its questions) as a corpus file, its
    questions plus sentences of its paragraphs as 2,000+ queries, and each question's own
    paragraphs (skips when ../shared/data is absent)."""
    data = shared_file("hotpotqa/hotpot_dev_distractor_300.json")
    examples = load("hotpotqa", "validation", path=data)
    corpus, _ = pooled_corpus(examples, name="hotpotqa-sample")
    path = folder / "hotpot.jsonl"
    corpus.to_jsonl(path)
    queries = [ex.question for ex in examples]
    for p in corpus:
        queries += [s for s in re.split(r"(?<=\.)\s", p.text)[:1] if len(s) > 20]
        if len(queries) >= 2100:
            break
    pools = [[p.id for p in ex.passages] for ex in examples]
    return path, queries, pools


def small_corpus(folder: Path, name: str, words: str) -> Path:
    """A tiny corpus file whose passages all hold ``words``."""
    path = folder / f"{name}.jsonl"
    Corpus(
        [
            Passage(f"{name}{i}", "", f"{words} of {name}")
            for i in (3, 11, 0, 7, 1, 10, 5, 2, 9, 4, 8, 6)
        ]
    ).to_jsonl(path)
    return path

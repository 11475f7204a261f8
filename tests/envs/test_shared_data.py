"""The data cache that envs of one process share: shared while the sources are unchanged, new
data for an env made after a data file is rewritten or an index is rebuilt at the same path."""

from __future__ import annotations

import json

from rag_gym.data import Corpus, Passage
from rag_gym.envs.search import SearchEnv
from rag_gym.retrieval import BM25Retriever


def write_jsonl(path, rows) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def corpus_rows(word: str) -> list[dict]:
    return [{"id": f"p{i}", "contents": f"T{i}\n{word} fact number {i}"} for i in range(8)]


def test_envs_share_data_until_a_file_is_rewritten(tmp_path):
    data, corpus = tmp_path / "qa.jsonl", tmp_path / "corpus.jsonl"
    write_jsonl(data, [{"id": "q1", "question": "Where is Vell?", "answer": "north"}])
    write_jsonl(corpus, corpus_rows("river"))
    kwargs = dict(dataset="bamboogle", data_path=str(data), corpus=str(corpus))
    first = SearchEnv(**kwargs)
    assert SearchEnv(**kwargs).retriever is first.retriever  # one index for both
    # the same size, written at once: only the content tells it apart
    write_jsonl(data, [{"id": "q1", "question": "Where is Bok?", "answer": "south"}])
    second = SearchEnv(**kwargs)
    assert second.examples[0].question == "Where is Bok?"
    assert first.examples[0].question == "Where is Vell?"  # an env keeps what it was made with
    write_jsonl(corpus, corpus_rows("mount"))
    third = SearchEnv(**kwargs)
    assert "mount fact" in third.corpus["p3"].text and "river" in first.corpus["p3"].text


def test_an_index_rebuilt_at_the_same_path_is_used_by_the_next_env(tmp_path):
    data, index = tmp_path / "qa.jsonl", tmp_path / "bm25"
    write_jsonl(data, [{"id": "q1", "question": "Where is Vell?", "answer": "north"}])
    old = Corpus(Passage(f"p{i}", f"T{i}", f"river fact {i}") for i in range(8))
    BM25Retriever(old).save(index)
    kwargs = dict(dataset="bamboogle", data_path=str(data), index=str(index))
    first = SearchEnv(**kwargs)
    assert SearchEnv(**kwargs).retriever is first.retriever
    words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel"]
    new = Corpus(Passage(f"p{i}", f"T{i}", f"mountain fact {w}") for i, w in enumerate(words))
    BM25Retriever(new).save(index)
    second = SearchEnv(**kwargs)
    assert second.retriever is not first.retriever
    assert second.corpus["p2"].text == "mountain fact charlie"
    ids = second.retriever.retrieve(["charlie"], 1).ids
    assert ids == [["p2"]]

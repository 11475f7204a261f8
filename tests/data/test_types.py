"""Corpus and its JSONL formats."""

from __future__ import annotations

import json

import pytest

from rag_gym.data import Corpus, DataFormatError, Passage


def test_corpus_roundtrip_both_formats(tmp_path):
    corpus = Corpus([Passage("a", "Title A", "Text a."), Passage("b", "", "Text b.")])
    for fmt in ("contents", "title_text"):
        path = tmp_path / f"{fmt}.jsonl"
        corpus.to_jsonl(path, fmt=fmt)
        again = Corpus.from_jsonl(path)
        assert list(again) == list(corpus)
        assert again.checksum() == corpus.checksum()


def test_contents_format_splits_title(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"id": 7, "contents": '"Ada"\nAda was born in Vell.'}) + "\n")
    (p,) = list(Corpus.from_jsonl(path))
    assert p == Passage("7", "Ada", "Ada was born in Vell.")


def test_duplicate_ids_rejected(tmp_path):
    with pytest.raises(ValueError, match="duplicate passage id 'a'"):
        Corpus([Passage("a", "", "x"), Passage("a", "", "y")])
    with pytest.raises(ValueError, match="duplicate passage id 'a'"):
        Corpus.from_columns(["a", "a"], ["", ""], ["x", "y"])
    path = tmp_path / "dup.jsonl"
    path.write_text('{"id": "a", "text": "x"}\n{"id": "a", "text": "y"}\n')
    with pytest.raises(
        DataFormatError, match=r"dup\.jsonl, line 2, field 'id': expected a unique id"
    ):
        Corpus.from_jsonl(path)


def test_bad_corpus_record(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "a", "body": "x"}\n')
    with pytest.raises(
        DataFormatError,
        match=r"bad\.jsonl, line 1, field 'contents': expected a 'contents' or a 'text' field",
    ):
        Corpus.from_jsonl(path)


def test_lookup_and_errors():
    corpus = Corpus.from_columns(["x", "y"], ["X", "Y"], ["tx", "ty"], name="c")
    assert corpus["y"].text == "ty" and corpus.position("y") == 1 and len(corpus) == 2
    with pytest.raises(KeyError, match="no passage with id 'z' in corpus 'c'"):
        corpus["z"]
    with pytest.raises(ValueError, match="expected ids, titles and texts of equal length"):
        Corpus.from_columns(["x"], [], [])

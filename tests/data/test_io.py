"""The reading helpers every loader shares: text that is not Unicode (a lone surrogate escape)
and integers longer than Python converts are refused naming the file, the record and the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rag_gym.data import Corpus, DataFormatError, load
from tests.data.test_loaders import _where as where
from tests.data.test_loaders import _write

CTX = [["T", ["s."]], ["U", ["t."]]]
GOOD = {
    "hotpotqa": ("h.json", {"_id": "a", "question": "q?", "answer": "x", "context": CTX}),
    "2wikimultihopqa": ("w.json", {"_id": "a", "question": "q?", "answer": "x", "context": CTX}),
    "musique": (
        "m.jsonl",
        {
            "id": "a",
            "question": "q?",
            "answer": "x",
            "paragraphs": [{"idx": 0, "title": "T", "paragraph_text": "p"}],
        },
    ),
    "flashrag": ("f.jsonl", {"id": "a", "question": "q?", "golden_answers": ["x"]}),
    "bamboogle": ("b.jsonl", {"id": "a", "question": "q?", "answer": "x"}),
}
#: where each dataset's passage text is, as (field path in the record, the error's field name)
PASSAGE = {
    "hotpotqa": (("context", 1, 1, 0), r"context\[1\]\[1\]\[0\]"),
    "2wikimultihopqa": (("context", 1, 1, 0), r"context\[1\]\[1\]\[0\]"),
    "musique": (("paragraphs", 0, "paragraph_text"), r"paragraphs\[0\]\.paragraph_text"),
}


def write(tmp_path: Path, name: str, records: list[dict]) -> Path:
    """``records`` as the file ``name``, each ``"<LONE>"`` written as the escape ``\\ud800``."""
    path = _write(tmp_path, name, records)
    path.write_text(path.read_text(encoding="utf-8").replace("<LONE>", "\\ud800"), encoding="utf-8")
    return path


@pytest.mark.parametrize("dataset", sorted(GOOD))
def test_a_lone_surrogate_in_a_question_names_file_record_and_field(tmp_path, dataset):
    name, rec = GOOD[dataset]
    second = {**rec, "_id": "b", "id": "b", "question": "Who is <LONE>Ada?"}
    path = write(tmp_path, name, [rec, second])
    with pytest.raises(
        DataFormatError,
        match=rf"{name}, {where(name, 1)}, field 'question': expected valid Unicode text",
    ):
        load(dataset, path=path)


@pytest.mark.parametrize("dataset", sorted(PASSAGE))
def test_a_lone_surrogate_in_a_passage_names_its_field(tmp_path, dataset):
    name, rec = GOOD[dataset]
    rec = json.loads(json.dumps(rec))
    keys, field = PASSAGE[dataset]
    target = rec
    for key in keys[:-1]:
        target = target[key]
    target[keys[-1]] = "Ada was born <LONE> in Vell."
    path = write(tmp_path, name, [rec])
    with pytest.raises(DataFormatError, match=rf"{where(name, 0)}, field '{field}'.*Unicode"):
        load(dataset, path=path)


def test_surrogate_pairs_and_escaped_backslashes_still_load(tmp_path):
    name, rec = GOOD["bamboogle"]
    # an emoji as a JSON surrogate pair, and the six characters \ud800 (an escaped backslash)
    path = tmp_path / name
    line = json.dumps({**rec, "question": "q \U0001f600 and \\ud800?"}, ensure_ascii=True)
    path.write_text(line + "\n", encoding="utf-8")
    assert load("bamboogle", path=path)[0].question == "q \U0001f600 and \\ud800?"


def test_a_lone_surrogate_in_a_corpus_names_the_line(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text(
        '{"id": "a", "contents": "T\\nok"}\n{"id": "b", "contents": "T\\nbad \\udc00 text"}\n',
        encoding="utf-8",
    )
    with pytest.raises(DataFormatError, match=r"corpus\.jsonl, line 2, field 'contents'"):
        Corpus.from_jsonl(path)


@pytest.mark.parametrize("dataset", sorted(GOOD))
def test_an_integer_over_4300_digits_names_the_file_and_record(tmp_path, dataset):
    name, rec = GOOD[dataset]
    path = write(tmp_path, name, [rec, {**rec, "_id": "b", "id": "b", "extra": "<BIG>"}])
    path.write_text(path.read_text().replace('"<BIG>"', "7" * 5000))
    line = "line 2" if name.endswith(".jsonl") else "line 1"  # a .json list: the file's line
    with pytest.raises(
        DataFormatError, match=rf"{name}, {line}, field '\(json\)': expected numbers of at most"
    ):
        load(dataset, path=path)

"""Loaders on the real samples in ../shared/data, and on malformed files."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rag_gym.data import DataFormatError, canonical_name, load, pooled_corpus
from tests.conftest import shared_file

HOTPOT = "hotpotqa/hotpot_dev_distractor_300.json"
HOTPOT_HF = "hotpotqa/hotpot_dev_distractor_hf_layout_300.jsonl"
TWOWIKI = "2wikimultihopqa/dev_250.json"
MUSIQUE = "musique/musique_ans_dev_100.jsonl"
BAMBOOGLE = "bamboogle/bamboogle.jsonl"


@pytest.mark.shared_data
@pytest.mark.parametrize(
    ("name", "relative", "count"),
    [
        ("hotpotqa", HOTPOT, 300),
        ("hotpotqa", HOTPOT_HF, 300),
        ("2wikimultihopqa", TWOWIKI, 250),
        ("musique", MUSIQUE, 100),
        ("bamboogle", BAMBOOGLE, 125),
    ],
)
def test_counts_and_basic_fields(name, relative, count):
    examples = load(name, path=shared_file(relative))
    assert len(examples) == count
    assert len({ex.id for ex in examples}) == count
    assert all(ex.question and ex.answers for ex in examples)


@pytest.mark.shared_data
@pytest.mark.parametrize("relative", [HOTPOT, HOTPOT_HF])
def test_hotpotqa_two_gold_passages_in_pool(relative):
    examples = load("hotpotqa", path=shared_file(relative))
    for ex in examples:
        pool = {p.id for p in ex.passages}
        assert len(ex.supporting_ids) == 2, ex.id
        assert set(ex.supporting_ids) <= pool, ex.id
        assert ex.hops == 2 and ex.type in ("bridge", "comparison")


@pytest.mark.shared_data
def test_hotpotqa_first_record_matches_file():
    path = shared_file(HOTPOT)
    raw = json.loads(path.read_text())[0]
    ex = load("hotpotqa", path=path)[0]
    assert ex.id == raw["_id"] and ex.answers == (raw["answer"],)
    assert ex.supporting_ids == ("Tinted Windows (album)", "Tinted Windows (band)")
    first_title, first_sents = raw["context"][0]
    assert ex.passages[0].title == first_title
    assert ex.passages[0].text == "".join(first_sents).strip()


@pytest.mark.shared_data
def test_hotpotqa_parquet_layout(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    src = shared_file(HOTPOT_HF)
    rows = [json.loads(line) for line in src.read_text().splitlines()[:20]]
    path = tmp_path / "validation.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    from_parquet = load("hotpotqa", path=path)
    from_jsonl = load("hotpotqa", path=src)[:20]
    assert [e.supporting_ids for e in from_parquet] == [e.supporting_ids for e in from_jsonl]
    assert [e.passages for e in from_parquet] == [e.passages for e in from_jsonl]


@pytest.mark.shared_data
def test_2wiki_gold_in_pool_and_evidences_kept():
    examples = load("2wiki", path=shared_file(TWOWIKI))
    for ex in examples:
        assert set(ex.supporting_ids) <= {p.id for p in ex.passages}
        assert ex.hops == len(ex.supporting_ids) in (2, 4)
        assert ex.meta["evidences"]
    assert examples[0].supporting_ids == ("Girl Rising (film)", "Richard E. Robbins")


@pytest.mark.shared_data
def test_musique_gold_count_equals_hops_and_aliases_kept():
    examples = load("musique", path=shared_file(MUSIQUE))
    for ex in examples:
        assert len(ex.supporting_ids) == ex.hops, ex.id
        assert ex.hops in (2, 3, 4)
        assert len(ex.passages) == 20
        assert ex.answerable is True
    first = examples[0]
    assert first.answers == ("The Hateful Eight", "Hateful Eight")
    # hop order follows the decomposition: paragraph 2 (hop 1) then paragraph 5 (hop 2)
    assert first.supporting_ids == (f"{first.id}::2", f"{first.id}::5")
    assert sum(len(ex.answers) > 1 for ex in examples) > 10


def test_musique_full_unanswerable_kept(tmp_path):
    record = {
        "id": "2hop__1_2",
        "question": "q?",
        "answer": "Vell",
        "answer_aliases": [],
        "answerable": False,
        "paragraphs": [
            {"idx": 0, "title": "T", "paragraph_text": "x", "is_supporting": True},
            {"idx": 1, "title": "U", "paragraph_text": "y", "is_supporting": False},
        ],
        "question_decomposition": [
            {"id": 1, "question": "a", "answer": "b", "paragraph_support_idx": 0},
            {"id": 2, "question": "c", "answer": "a", "paragraph_support_idx": None},
        ],
    }
    path = tmp_path / "musique_full_dev.jsonl"
    path.write_text(json.dumps(record) + "\n")
    (ex,) = load("musique", path=path)
    assert ex.answerable is False and ex.supporting_ids == ("2hop__1_2::0",) and ex.hops == 2


@pytest.mark.shared_data
def test_bamboogle_jsonl_and_tsv_agree(tmp_path):
    examples = load("bamboogle", path=shared_file(BAMBOOGLE))
    assert examples[0].answers == ("james madison",) and not examples[0].passages
    tsv = tmp_path / "bamboogle.tsv"
    tsv.write_text("Question\tAnswer\n" + "".join(f"{e.question}\t{e.answer}\n" for e in examples))
    from_tsv = load("bamboogle", path=tsv)
    assert [(e.question, e.answers) for e in from_tsv] == [
        (e.question, e.answers) for e in examples
    ]


def test_flashrag_format(tmp_path):
    path = tmp_path / "nq_test.jsonl"
    path.write_text(
        json.dumps(
            {
                "id": "test_0",
                "question": "who?",
                "golden_answers": ["Ann", "Bo"],
                "metadata": {"x": 1},
            }
        )
        + "\n"
    )
    (ex,) = load("flashrag", path=path)
    assert ex.answers == ("Ann", "Bo") and ex.meta == {"x": 1} and ex.passages == ()


@pytest.mark.shared_data
def test_pooled_corpus_renames_conflicting_titles():
    examples = load("hotpotqa", path=shared_file(HOTPOT))
    corpus, renamed = pooled_corpus(examples)
    assert any(" #2" in pid for pid in corpus.ids)  # the sample has two different "Harry Morgan"s
    for ex in renamed:
        for p in ex.passages:
            assert corpus[p.id].text == p.text
        assert set(ex.supporting_ids) <= {p.id for p in ex.passages}


# ---- malformed files name the file, the record and the field --------------------------------
def _write_json(tmp_path: Path, name: str, data) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def test_hotpotqa_missing_question(tmp_path):
    path = _write_json(
        tmp_path,
        "bad.json",
        [
            {"_id": "a", "question": "q", "answer": "x", "context": [["T", ["s."]]]},
            {"_id": "b", "answer": "x"},
        ],
    )
    with pytest.raises(
        DataFormatError,
        match=r"bad\.json, record 1, field 'question': expected the field to be present",
    ):
        load("hotpotqa", path=path)


def test_hotpotqa_gold_title_not_in_context(tmp_path):
    rec = {
        "_id": "a",
        "question": "q",
        "answer": "x",
        "supporting_facts": [["Missing", 0]],
        "context": [["Other", ["s."]]],
    }
    path = _write_json(tmp_path, "bad.json", [rec])
    with pytest.raises(
        DataFormatError,
        match=r"record 0, field 'supporting_facts': expected titles that appear in 'context'",
    ):
        load("hotpotqa", path=path)


def test_2wiki_bad_context_pair(tmp_path):
    rec = {"_id": "a", "question": "q", "answer": "x", "context": [["T", "not a list"]]}
    path = _write_json(tmp_path, "dev.json", [rec])
    with pytest.raises(DataFormatError, match=r"dev\.json, record 0, field 'context\[0\]'"):
        load("2wikimultihopqa", path=path)


def test_musique_bad_support_idx(tmp_path):
    rec = {
        "id": "x",
        "question": "q",
        "answer": "Vell",
        "paragraphs": [{"idx": 0, "title": "T", "paragraph_text": "p"}],
        "question_decomposition": [{"paragraph_support_idx": 7}],
    }
    path = tmp_path / "m.jsonl"
    path.write_text("\n" + json.dumps(rec) + "\n")
    with pytest.raises(
        DataFormatError,
        match=r"m\.jsonl, line 2, field 'question_decomposition\[0\]\.paragraph_support_idx'",
    ):
        load("musique", path=path)


def test_jsonl_bad_json_line(tmp_path):
    path = tmp_path / "b.jsonl"
    path.write_text('{"id": "1", "question": "q", "answer": "Vell"}\n{not json\n')
    with pytest.raises(
        DataFormatError, match=r"b\.jsonl, line 2, field '\(json\)': expected valid JSON"
    ):
        load("bamboogle", path=path)


def test_flashrag_answers_wrong_type(tmp_path):
    path = tmp_path / "f.jsonl"
    path.write_text(json.dumps({"id": "1", "question": "q", "golden_answers": [1, 2]}) + "\n")
    with pytest.raises(
        DataFormatError, match=r"line 1, field 'golden_answers': expected a list of strings"
    ):
        load("flashrag", path=path)


def test_bamboogle_tsv_missing_column(tmp_path):
    path = tmp_path / "b.tsv"
    path.write_text("Q\tAnswer\nx\ty\n")
    with pytest.raises(DataFormatError, match=r"b\.tsv, line 1, field 'Question'"):
        load("bamboogle", path=path)


def test_missing_file_and_wrong_suffix(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file"):
        load("hotpotqa", path=tmp_path / "nope.json")
    path = tmp_path / "data.xml"
    path.write_text("<x/>")
    with pytest.raises(
        ValueError, match=r"expected a \.json, \.jsonl or \.parquet file, got 'data.xml'"
    ):
        load("hotpotqa", path=path)


def test_unknown_dataset_did_you_mean():
    with pytest.raises(ValueError, match="did you mean 'musique'"):
        canonical_name("musiqe")
    with pytest.raises(TypeError, match="expected a dataset name"):
        canonical_name(3)
    assert canonical_name("2Wiki") == "2wikimultihopqa"


def test_datasets_without_hub_copy_say_where_to_get_them():
    with pytest.raises(ValueError, match="pass path="):
        load("musique")
    with pytest.raises(ValueError, match="pass path="):
        load("2wikimultihopqa")


# ---- records a loader refuses: repeated ids, empty questions and pools, empty files ---------
CTX = [["T", ["s."]]]
GOOD = {
    "hotpotqa": ("h.json", {"_id": "a", "question": "q?", "answer": "x", "context": CTX}),
    "2wikimultihopqa": ("w.json", {"_id": "a", "question": "q?", "answer": "x", "context": CTX}),
    "musique": (
        "m.jsonl",
        {
            "id": "a",
            "question": "q?",
            "answer": "x",
            "paragraphs": [{"idx": 0, "paragraph_text": "p"}],
        },
    ),
    "flashrag": ("f.jsonl", {"id": "a", "question": "q?", "golden_answers": ["x"]}),
    "bamboogle": ("b.jsonl", {"id": "a", "question": "q?", "answer": "x"}),
}


def _write(tmp_path: Path, name: str, records) -> Path:
    path = tmp_path / name
    if name.endswith(".jsonl"):
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    else:
        path.write_text(json.dumps(records))
    return path


def _where(name: str, i: int) -> str:
    return f"line {i + 1}" if name.endswith(".jsonl") else f"record {i}"


@pytest.mark.parametrize("dataset", sorted(GOOD))
def test_a_repeated_question_id_names_both_records(tmp_path, dataset):
    name, rec = GOOD[dataset]
    other = {**rec, "question": "another?"}
    path = _write(tmp_path, name, [rec, {**rec, "question": "b?", "_id": "b", "id": "b"}, other])
    first, third = _where(name, 0), _where(name, 2)
    with pytest.raises(
        DataFormatError, match=rf"{name}, {first} and {third}, field '_?id': expected unique"
    ):
        load(dataset, path=path)


def test_a_repeated_bamboogle_tsv_row_is_fine_but_an_empty_table_is_not(tmp_path):
    path = tmp_path / "b.tsv"
    path.write_text("Question\tAnswer\nq?\tx\nq?\tx\n")  # rows are numbered: ids never repeat
    assert [ex.id for ex in load("bamboogle", path=path)] == ["bamboogle-1", "bamboogle-2"]
    path.write_text("Question\tAnswer\n")
    with pytest.raises(DataFormatError, match=r"b\.tsv, \(file\), .*at least one record, got no"):
        load("bamboogle", path=path)


@pytest.mark.parametrize("dataset", sorted(GOOD))
@pytest.mark.parametrize("question", ["", "  \n"])
def test_an_empty_question_is_refused(tmp_path, dataset, question):
    name, rec = GOOD[dataset]
    path = _write(tmp_path, name, [rec, {**rec, "_id": "b", "id": "b", "question": question}])
    with pytest.raises(
        DataFormatError,
        match=rf"{_where(name, 1)}, field 'question': expected a non-empty question",
    ):
        load(dataset, path=path)


@pytest.mark.parametrize(
    ("dataset", "field", "value"),
    [
        ("hotpotqa", "context", []),
        ("hotpotqa", "context", None),
        ("hotpotqa", "context", {"title": [], "sentences": []}),
        ("2wikimultihopqa", "context", []),
        ("2wikimultihopqa", "context", None),
        ("musique", "paragraphs", []),
    ],
)
def test_an_empty_or_missing_pool_is_refused(tmp_path, dataset, field, value):
    name, rec = GOOD[dataset]
    bad = {k: v for k, v in rec.items() if k != field}
    if value is not None:
        bad[field] = value
    path = _write(tmp_path, name, [rec, {**bad, "_id": "b", "id": "b"}])
    got = "it is missing" if value is None else re.escape(repr(value))
    with pytest.raises(
        DataFormatError,
        match=rf"{_where(name, 1)}, field '{field}': expected a non-empty list of paragraphs, got {got}",
    ):
        load(dataset, path=path)


@pytest.mark.parametrize(
    ("dataset", "content"),
    [
        (dataset, content)
        for dataset, (name, _) in sorted(GOOD.items())
        for content in (["", "\n\n"] + (["[]", '{"data": []}'] if name.endswith(".json") else []))
    ],
)
def test_a_file_without_records_is_refused(tmp_path, dataset, content):
    name, _ = GOOD[dataset]
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(DataFormatError, match=rf"{name}, \(file\), .*got no records"):
        load(dataset, path=path)


def test_an_empty_corpus_file_is_refused(tmp_path):
    from rag_gym.data import Corpus

    path = tmp_path / "c.jsonl"
    path.write_text("\n")
    with pytest.raises(DataFormatError, match=r"c\.jsonl, \(file\), .*at least one passage"):
        Corpus.from_jsonl(path)


@pytest.mark.parametrize("dataset", sorted(GOOD))
def test_bytes_that_are_not_utf8_name_the_file_and_line(tmp_path, dataset):
    name, rec = GOOD[dataset]
    path = _write(tmp_path, name, [rec, {**rec, "_id": "b", "id": "b"}])
    raw = path.read_bytes()
    if name.endswith(".jsonl"):
        lines = raw.split(b"\n")
        lines[1] = lines[1].replace(b"q?", b"q\xff?")
        raw = b"\n".join(lines)
        where = "line 2"
    else:
        raw = raw.replace(b"q?", b"q\xc3(?", 1)
        where = "line 1"
    path.write_bytes(raw)
    with pytest.raises(
        DataFormatError, match=rf"{name}, {where}, field '\(encoding\)': expected UTF-8"
    ):
        load(dataset, path=path)


def test_not_utf8_in_a_tsv_and_a_corpus(tmp_path):
    from rag_gym.data import Corpus

    tsv = tmp_path / "b.tsv"
    tsv.write_bytes(b"Question\tAnswer\nq?\tx\nq\xff?\tx\n")
    with pytest.raises(DataFormatError, match=r"b\.tsv, line 3, field '\(encoding\)'.*column 2"):
        load("bamboogle", path=tsv)
    corpus = tmp_path / "c.jsonl"
    corpus.write_bytes(b'{"id": "a", "text": "ok"}\n{"id": "b", "text": "\xe9"}\n')
    with pytest.raises(DataFormatError, match=r"c\.jsonl, line 2, field '\(encoding\)'"):
        Corpus.from_jsonl(corpus)


@pytest.mark.parametrize("name", ["h.json", "h.jsonl"])
def test_json_nested_100k_deep_names_the_file(tmp_path, name):
    path = tmp_path / name
    deep = "[" * 100_000 + "]" * 100_000
    path.write_text(
        deep if name.endswith(".json") else json.dumps(GOOD["musique"][1]) + "\n" + deep + "\n"
    )
    where = r"\(file\)" if name.endswith(".json") else "line 2"
    with pytest.raises(
        DataFormatError, match=rf"{name}, {where}, field '\(json\)'.*nesting too deep"
    ):
        load("hotpotqa" if name.endswith(".json") else "musique", path=path)


def test_a_damaged_parquet_file_names_the_file(tmp_path):
    pytest.importorskip("pyarrow")
    path = tmp_path / "h.parquet"
    path.write_bytes(b"PAR1 not really")
    with pytest.raises(DataFormatError, match=r"h\.parquet, \(file\), field '\(parquet\)'"):
        load("hotpotqa", path=path)


def test_an_env_refuses_repeated_ids_in_examples():
    from rag_gym.data import Passage, QAExample
    from rag_gym.envs import SearchEnv

    pool = (Passage("p1", "T", "Ada was born in Vell."),)
    q = QAExample("q1", "Where was Ada born?", ("Vell",), ("p1",), pool)
    with pytest.raises(
        ValueError, match=r"unique question ids, got 'q1' at examples\[0\] and examples\[2\]"
    ):
        SearchEnv(examples=[q, QAExample("q2", "?", ("x",), (), pool), q])


def test_musique_paragraphs_sharing_an_idx_are_refused(tmp_path):
    name, rec = GOOD["musique"]
    paragraphs = [{"idx": 0, "paragraph_text": "p"}, {"idx": 0, "paragraph_text": "q"}]
    path = _write(tmp_path, name, [{**rec, "paragraphs": paragraphs}])
    with pytest.raises(
        DataFormatError, match=r"line 1, field 'paragraphs\[1\]\.idx': expected an idx no other"
    ):
        load("musique", path=path)


@pytest.mark.parametrize("support", [[0], {"a": 1}, True])
def test_musique_support_idx_that_is_not_an_int_is_refused(tmp_path, support):
    name, rec = GOOD["musique"]
    steps = [{"question": "s", "answer": "x", "paragraph_support_idx": support}]
    path = _write(tmp_path, name, [{**rec, "question_decomposition": steps}])
    with pytest.raises(DataFormatError, match=r"paragraph_support_idx': expected the idx of one"):
        load("musique", path=path)


#: Where each loader's answer lives: (field to set, value for an answer, field the error names)
ANSWER_FIELDS = {
    "hotpotqa": ("answer", lambda a: a, "answer"),
    "2wikimultihopqa": ("answer", lambda a: a, "answer"),
    "musique": ("answer", lambda a: a, "answer"),
    "flashrag": ("golden_answers", lambda a: ["Paris", a], r"golden_answers\[1\]"),
    "bamboogle": ("answer", lambda a: a, "answer"),
}


@pytest.mark.parametrize("dataset", sorted(GOOD))
@pytest.mark.parametrize("answer", ["", "  ", "The", "a.", "An!"])
def test_a_gold_answer_that_normalises_to_nothing_is_refused(tmp_path, dataset, answer):
    # against it, "an" would score EM 1 and reward 1
    name, rec = GOOD[dataset]
    field, value, named = ANSWER_FIELDS[dataset]
    bad = {**rec, "_id": "b", "id": "b", field: value(answer)}
    path = _write(tmp_path, name, [rec, bad])
    with pytest.raises(
        DataFormatError,
        match=rf"{name}, {_where(name, 1)}, field '{named}': expected a gold answer that keeps a "
        rf"word after normalisation",
    ):
        load(dataset, path=path)


def test_musique_aliases_and_a_tsv_answer_that_normalise_to_nothing_are_refused(tmp_path):
    name, rec = GOOD["musique"]
    path = _write(tmp_path, name, [{**rec, "answer_aliases": ["Paris", "the"]}])
    with pytest.raises(DataFormatError, match=r"line 1, field 'answer_aliases\[1\]'"):
        load("musique", path=path)
    tsv = tmp_path / "b.tsv"
    tsv.write_text("Question\tAnswer\nq?\tThe\n")
    with pytest.raises(DataFormatError, match=r"b\.tsv, line 2, field 'Answer'.*got 'The'"):
        load("bamboogle", path=tsv)


def test_unanswerable_and_unlabelled_questions_keep_loading_without_answers(tmp_path):
    name, rec = GOOD["musique"]
    unans = {**rec, "answerable": False, "answer": ""}
    (ex,) = load("musique", path=_write(tmp_path, name, [unans]))
    assert ex.answers == () and ex.answerable is False
    hot = {k: v for k, v in GOOD["hotpotqa"][1].items() if k != "answer"}  # a test file
    assert load("hotpotqa", path=_write(tmp_path, "h.json", [hot]))[0].answers == ()
    flash = {**GOOD["flashrag"][1], "golden_answers": []}
    assert load("flashrag", path=_write(tmp_path, "f.jsonl", [flash]))[0].answers == ()


def test_a_qaexample_refuses_an_answer_that_normalises_to_nothing():
    from rag_gym.data import QAExample

    with pytest.raises(ValueError, match=r"question 'q1''s answers .* got 'The'"):
        QAExample("q1", "Who?", ("Ada", "The"))
    with pytest.raises(ValueError, match=r"got 5"):
        QAExample("q1", "Who?", (5,))  # type: ignore[arg-type]
    assert QAExample("q1", "Who?", ()).answers == ()


@pytest.mark.parametrize(
    ("qid", "match"),
    [
        (True, "expected a string or integer id, got True"),
        (False, "expected a string or integer id, got False"),
        ("", "expected a non-empty id, got ''"),
        ("  ", "expected a non-empty id, got '  '"),
        (None, "expected a string or integer id, got None"),
    ],
)
def test_a_flashrag_id_that_is_a_bool_or_empty_is_refused(tmp_path, qid, match):
    path = _write(tmp_path, "f.jsonl", [{**GOOD["flashrag"][1], "id": qid}])
    with pytest.raises(DataFormatError, match=rf"f\.jsonl, line 1, field 'id': {match}"):
        load("flashrag", path=path)
    assert (
        load("flashrag", path=_write(tmp_path, "g.jsonl", [{**GOOD["flashrag"][1], "id": 7}]))[0].id
        == "7"
    )


@pytest.mark.parametrize("dataset", ["hotpotqa", "2wikimultihopqa", "musique"])
def test_an_empty_id_is_refused_by_every_loader(tmp_path, dataset):
    name, rec = GOOD[dataset]
    path = _write(tmp_path, name, [{**rec, "_id": " ", "id": " "}])
    with pytest.raises(DataFormatError, match=r"field '_?id': expected a non-empty id"):
        load(dataset, path=path)

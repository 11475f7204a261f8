"""The fixed split by question id, folders of data files, and the supporting sentences kept."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import pytest

import rag_gym  # noqa: F401  (registers the envs)
from rag_gym.data import DataFormatError, load
from rag_gym.data.splits import SPLIT_FRACTIONS, id_split, select
from tests.conftest import SHARED_DATA, shared_file


def _hotpot_record(qid: str, answer: str = "Vell") -> dict:
    return {
        "_id": qid,
        "question": f"Where was the author of book {qid} born?",
        "answer": answer,
        "type": "bridge",
        "level": "hard",
        "supporting_facts": [[f"Book {qid}", 0], ["Ada", 1]],
        "context": [
            [f"Book {qid}", [f"Book {qid} is a novel by Ada.", " It sold well."]],
            ["Ada", ["Ada is a writer.", " She was born in Vell."]],
            ["Kest", ["Kest is a town."]],
        ],
    }


def _write(path: Path, records: list[dict]) -> Path:
    path.write_text(json.dumps(records))
    return path


def test_the_split_of_an_id_never_moves_and_the_shares_hold():
    ids = [f"q{i}" for i in range(20_000)]
    splits = [id_split(q) for q in ids]
    assert splits == [id_split(q) for q in ids]  # a function of the id alone
    for name, share in SPLIT_FRACTIONS.items():
        assert abs(splits.count(name) / len(ids) - share) < 0.01, name
    assert set(splits) == set(SPLIT_FRACTIONS)


def test_split_by_id_partitions_a_file_whatever_its_order_or_company(tmp_path):
    records = [_hotpot_record(f"id{i}") for i in range(60)]
    one = _write(tmp_path / "a.json", records)
    parts = {s: load("hotpotqa", s, path=one, split_by_id=True) for s in SPLIT_FRACTIONS}
    ids = {s: {ex.id for ex in exs} for s, exs in parts.items()}
    assert sum(len(v) for v in ids.values()) == 60
    assert set().union(*ids.values()) == {r["_id"] for r in records}
    for a in SPLIT_FRACTIONS:  # disjoint
        for b in SPLIT_FRACTIONS:
            assert a == b or not ids[a] & ids[b], (a, b)
    # the same questions reversed and split over two files of a folder: the same splits
    folder = tmp_path / "folder"
    folder.mkdir()
    _write(folder / "x.json", records[::-1][:25])
    _write(folder / "y.json", records[::-1][25:])
    for s in SPLIT_FRACTIONS:
        assert {ex.id for ex in load("hotpotqa", s, path=folder, split_by_id=True)} == ids[s]


def test_split_by_id_errors_are_clear(tmp_path):
    path = _write(tmp_path / "a.json", [_hotpot_record("x")])
    with pytest.raises(ValueError, match=r"expected a split in \[.*\], got 'dve'; did you mean"):
        load("hotpotqa", "dve", path=path, split_by_id=True)
    assert load("hotpotqa", "dev", path=path, split_by_id=True) == load(
        "hotpotqa", "validation", path=path, split_by_id=True
    )
    with pytest.raises(ValueError, match="split_by_id splits the questions of a file"):
        load("synthhop", "train", split_by_id=True)
    with pytest.raises(TypeError, match="split_by_id to be True or False"):
        load("hotpotqa", "train", path=path, split_by_id="yes")


def test_a_folder_reads_every_file_and_refuses_an_id_twice(tmp_path):
    _write(tmp_path / "a.json", [_hotpot_record("x"), _hotpot_record("y")])
    (tmp_path / "b.jsonl").write_text(json.dumps(_hotpot_record("z")) + "\n")
    (tmp_path / "notes.txt").write_text("not data")
    assert [ex.id for ex in load("hotpotqa", path=tmp_path)] == ["x", "y", "z"]
    _write(tmp_path / "c.json", [_hotpot_record("y")])
    with pytest.raises(DataFormatError, match=r"c\.json.*ids not already read from a\.json"):
        load("hotpotqa", path=tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataFormatError, match="at least one"):
        load("hotpotqa", path=empty)


def test_an_env_poses_only_its_split(tmp_path):
    records = [_hotpot_record(f"id{i}") for i in range(40)]
    path = _write(tmp_path / "a.json", records)
    env = gym.make(
        "rag_gym/HotpotQA-v0",
        data_path=str(path),
        split="test",
        dataset_kwargs={"split_by_id": True},
    )
    assert {ex.id for ex in env.unwrapped.examples} == {
        r["_id"] for r in records if id_split(r["_id"]) == "test"
    }
    env.close()


def test_supporting_sentences_are_kept_in_both_layouts(tmp_path):
    record = _hotpot_record("x")
    ex = load("hotpotqa", path=_write(tmp_path / "a.json", [record]))[0]
    assert ex.meta["support"] == (
        ("Book x", "Book x is a novel by Ada."),
        ("Ada", "She was born in Vell."),
    )
    hf = dict(record)
    hf["supporting_facts"] = {"title": ["Book x", "Ada"], "sent_id": [0, 1]}
    hf["context"] = {
        "title": [t for t, _ in record["context"]],
        "sentences": [s for _, s in record["context"]],
    }
    (tmp_path / "hf.jsonl").write_text(json.dumps(hf) + "\n")
    assert load("hotpotqa", path=tmp_path / "hf.jsonl")[0].meta["support"] == ex.meta["support"]


def test_nested_supporting_facts_name_the_record_and_field(tmp_path):
    record = _hotpot_record("x")
    record["supporting_facts"] = {"title": [["Book x"], ["Ada"]], "sent_id": [0, 1]}
    path = tmp_path / "hf.jsonl"
    path.write_text(json.dumps(record) + "\n")
    with pytest.raises(DataFormatError, match=r"line 1, field 'supporting_facts\[0\]'"):
        load("hotpotqa", path=path)


@pytest.mark.shared_data
def test_the_samples_split_is_disjoint_and_covers_every_question():
    shared_file("hotpotqa/hotpot_dev_distractor_300.json")
    for name, folder, total in (
        ("hotpotqa", "hotpotqa", 600),
        ("2wikimultihopqa", "2wikimultihopqa", 250),
        ("musique", "musique", 100),
    ):
        parts = {
            s: {ex.id for ex in load(name, s, path=SHARED_DATA / folder, split_by_id=True)}
            for s in SPLIT_FRACTIONS
        }
        assert sum(map(len, parts.values())) == total, name
        assert len(set().union(*parts.values())) == total, name
        assert all(parts[s] for s in SPLIT_FRACTIONS), name
    whole = load("hotpotqa", path=SHARED_DATA / "hotpotqa")
    assert [ex.id for ex in select(whole, "test")] == [
        ex.id for ex in load("hotpotqa", "test", path=SHARED_DATA / "hotpotqa", split_by_id=True)
    ]


def test_a_folder_reads_only_the_files_of_the_requested_split(tmp_path):
    # the official names: HotpotQA's dev and train files side by side, 100 + 500 questions
    _write(
        tmp_path / "hotpot_dev_distractor_v1.json", [_hotpot_record(f"d{i}") for i in range(100)]
    )
    (tmp_path / "hotpot_train_v1.1.jsonl").write_text(
        "".join(json.dumps(_hotpot_record(f"t{i}")) + "\n" for i in range(500))
    )
    env = gym.make("rag_gym/HotpotQA-v0", data_path=str(tmp_path), split="dev")
    examples = env.unwrapped.examples
    assert len(examples) == 100 and all(ex.id.startswith("d") for ex in examples)
    assert {ex.meta["source_file"] for ex in examples} == {"hotpot_dev_distractor_v1.json"}
    env.close()
    for split in ("validation", "val", "dev"):
        assert len(load("hotpotqa", split, path=tmp_path)) == 100
    assert {ex.id[0] for ex in load("hotpotqa", "train", path=tmp_path)} == {"t"}
    # no file of the split: refused, naming the folder, the files and the fix
    with pytest.raises(
        DataFormatError,
        match=r"(?s)expected a data file of split 'test' \(a name holding 'test'\) beside "
        r"hotpot_dev_distractor_v1\.json \(validation\), hotpot_train_v1\.1\.jsonl \(train\): "
        r"pass the split these files hold, or add the file, got no file of that split",
    ):
        load("hotpotqa", "test", path=tmp_path)
    # with split_by_id every file is read, and the ids choose
    assert len(load("hotpotqa", "train", path=tmp_path, split_by_id=True)) == len(
        select(
            load("hotpotqa", "train", path=tmp_path) + load("hotpotqa", "dev", path=tmp_path),
            "train",
        )
    )


@pytest.mark.parametrize(
    ("names", "split", "expected"),
    [
        (["dev.json", "train.json", "test.json"], "dev", ["dev.json"]),  # 2Wiki, FlashRAG
        (["musique_ans_v1.0_dev.jsonl", "musique_ans_v1.0_train.jsonl"], "validation", [0]),
        (["train-00000-of-00002.parquet", "validation-00000-of-00001.parquet"], "train", [0]),
        (["a.json", "b.json"], "test", ["a.json", "b.json"]),  # no name declares a split
    ],
)
def test_the_split_a_file_name_declares(tmp_path, names, split, expected):
    from rag_gym.data import _files_of_split

    files = [tmp_path / n for n in names]
    chosen = _files_of_split(tmp_path, files, split)
    assert [f.name for f in chosen] == [names[e] if isinstance(e, int) else e for e in expected]


@pytest.mark.parametrize("other", ["notes.json", "train_dev.json"])
def test_a_folder_mixing_named_and_unnamed_files_is_refused(tmp_path, other):
    _write(tmp_path / "dev.json", [_hotpot_record("x")])
    _write(tmp_path / other, [_hotpot_record("y")])
    with pytest.raises(
        DataFormatError,
        match=rf"field '\(file names\)': expected every data file's name to declare one split.*"
        rf"dev\.json \(validation\).*got \['{other}'\]",
    ):
        load("hotpotqa", "dev", path=tmp_path)


@pytest.mark.parametrize("split", ["nosuch", "Dev", "", "dev "])
def test_an_unknown_split_is_refused_everywhere(tmp_path, split):
    path = _write(tmp_path / "a.json", [_hotpot_record("x")])
    match = rf"expected a split in \['dev', 'test', 'train', 'val', 'valid', 'validation'\], got {split!r}"
    with pytest.raises(ValueError, match=match):
        load("hotpotqa", split, path=path)
    with pytest.raises(ValueError, match=match):
        load("synthhop", split, n_passages=2000, n_questions=(40, 10, 10))
    with pytest.raises(ValueError, match=match):
        gym.make("rag_gym/HotpotQA-v0", data_path=str(path), split=split)
    with pytest.raises(TypeError, match="expected split to be a str, got list"):
        load("hotpotqa", ["dev"], path=path)


@pytest.mark.shared_data
def test_the_multihop_suite_reads_the_split_it_labels():
    import json as _json

    from rag_gym.evaluate.suite import SUITES_DIR

    shared_file("hotpotqa/hotpot_dev_distractor_300.json")
    suite = _json.loads((SUITES_DIR / "multihop.json").read_text())
    loaders = {"HotpotQA": "hotpotqa", "2Wiki": "2wikimultihopqa", "MuSiQue": "musique"}
    for d in suite["datasets"]:
        if d["name"] in loaders:  # the sample files are all dev files, named so
            examples = load(loaders[d["name"]], d["split"], path=SHARED_DATA / d["data"])
            assert examples and all("dev" in ex.meta["source_file"] for ex in examples)
            with pytest.raises(DataFormatError, match="no file of that split"):
                load(loaders[d["name"]], "train", path=SHARED_DATA / d["data"])

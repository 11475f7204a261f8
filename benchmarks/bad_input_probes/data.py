"""Bad inputs around datasets: a folder ``data_path`` and the split it is asked for, unknown
split names, gold answers that normalise to nothing (refused by every loader, by ``QAExample`` and
by the answer metrics), question ids that are booleans or empty, and env reset options, pickle and
deepcopy of an env.

Handled cleanly: a folder reads only the requested split's files (or is refused with a
``DataFormatError`` naming the folder and its files), an unknown split is a ``ValueError`` listing
the known ones, an empty gold answer is a ``DataFormatError`` naming the file, record and field (a
``ValueError`` from a metric), and a bad reset option is a ``TypeError`` / ``ValueError`` saying
``expected``.
"""

from __future__ import annotations

import copy
import pickle
from pathlib import Path

import gymnasium as gym

import rag_gym  # noqa: F401
from bad_input_probes import GOOD, SMALL, write
from rag_gym import metrics
from rag_gym.data import DataFormatError, QAExample, load

# ---- a folder data path reads the split it is asked for, and only known splits ---------
#: (dataset, {file name: split the file holds}) as each benchmark ships its files
LAYOUTS = {
    "hotpotqa": {
        "hotpot_dev_distractor_v1.json": "validation",
        "hotpot_train_v1.1.json": "train",
    },
    "hotpotqa-jsonl": {
        "hotpot_dev_distractor_v1.json": "validation",
        "hotpot_train_v1.1.jsonl": "train",
    },
    "2wikimultihopqa": {"dev.json": "validation", "train.json": "train", "test.json": "test"},
    "musique": {
        "musique_ans_v1.0_dev.jsonl": "validation",
        "musique_ans_v1.0_train.jsonl": "train",
        "musique_ans_v1.0_test.jsonl": "test",
    },
    "flashrag": {"dev.jsonl": "validation", "test.jsonl": "test", "train.jsonl": "train"},
    "hf-parquet-names": {
        "train-00000-of-00001.jsonl": "train",
        "validation-00000-of-00001.jsonl": "validation",
    },
}
SPLITS = ["train", "validation", "dev", "val", "valid", "test"]
#: the split each accepted name stands for
SPLIT_NAMES = {"train": "train", "test": "test", **dict.fromkeys(SPLITS[1:5], "validation")}
BAD_SPLITS = ["nosuch", "Dev", "DEV", "", " ", "dev ", "tset", "validate", "training", "all"]


def _folder_records(dataset: str, tag: str, n: int) -> list[dict]:
    """``n`` records of ``dataset`` with ids ``<tag><i>``, with passages an env can index."""
    _, rec = GOOD[dataset]
    rec = dict(rec)
    if "context" in rec:
        rec["context"] = [["Ada", ["Ada was born in Vell."]], ["Kest", ["Kest is a town."]]]
        rec["supporting_facts"] = [["Ada", 0]]
    if "paragraphs" in rec:
        rec["paragraphs"] = [
            {
                "idx": 0,
                "title": "Ada",
                "paragraph_text": "Ada was born in Vell.",
                "is_supporting": True,
            }
        ]
    return [
        {**rec, "_id": f"{tag}{i}", "id": f"{tag}{i}", "question": f"{tag} {i}?"} for i in range(n)
    ]


def _split_is_clean(exc: Exception, folder: Path) -> bool:
    text = str(exc)
    return isinstance(exc, (DataFormatError, ValueError, TypeError)) and (
        str(folder) in text or "expected a split" in text or "expected split" in text
    )


def probe_split_folders(tmp: Path) -> tuple[int, int]:
    """Folders laid out as the benchmarks ship them (dev + train + test files), each asked for
    each split name: clean when exactly the files of that split are read, or the load is
    refused with an error naming the folder; unknown split names must be refused (by load, by
    gym.make and by ``rag-gym evaluate --split``), mixed folders (a file whose name declares no
    split beside ones that do) must be refused, and a folder whose names declare no split is
    read whole."""
    from typer.testing import CliRunner

    from rag_gym.cli import app

    tried = clean = 0
    sizes = {"train": 500, "validation": 100, "test": 40}
    for layout, files in LAYOUTS.items():
        dataset = layout.split("-")[0] if layout.split("-")[0] in GOOD else "flashrag"
        folder = tmp / f"split-{layout}"
        folder.mkdir()
        for name, split in files.items():
            write(folder / name, _folder_records(dataset, f"{split}-", sizes[split]))
        for split in SPLITS + BAD_SPLITS:
            tried += 1
            want = SPLIT_NAMES.get(split)
            try:
                got = load(dataset, split, path=folder)
            except Exception as exc:
                ok = _split_is_clean(exc, folder) and (want is None or want not in files.values())
                clean += ok
                if not ok:
                    print(f"  split {layout} {split!r}: {type(exc).__name__}: {str(exc)[:120]}")
                continue
            ok = (
                want is not None
                and {e.id.split("-")[0] for e in got} == {want}
                and len(got) == sizes[want] * sum(s == want for s in files.values())
            )
            clean += ok
            if not ok:
                print(
                    f"  split {layout} {split!r}: read {len(got)} questions of {sorted({e.id.split('-')[0] for e in got})}"
                )
        # the same through gym.make (the env's split reaches the loader)
        env_id = {
            "hotpotqa": "rag_gym/HotpotQA-v0",
            "2wikimultihopqa": "rag_gym/2WikiMultiHopQA-v0",
            "musique": "rag_gym/MuSiQue-v0",
        }.get(dataset)
        if env_id:
            for split in ("dev", "train", "nosuch"):
                tried += 1
                try:
                    env = gym.make(env_id, data_path=str(folder), split=split)
                    exs = env.unwrapped.examples
                    ok = {e.id.split("-")[0] for e in exs} == {SPLIT_NAMES[split]}
                    env.close()
                except Exception as exc:
                    ok = split == "nosuch" and _split_is_clean(exc, folder)
                clean += ok
                if not ok:
                    print(f"  split gym.make {layout} {split!r}: not clean")
    # a file whose name declares no split (or two) beside files that do: refused
    for other in ("notes.json", "questions.json", "train_dev.json", "dev-and-test.json"):
        for split in ("dev", "train"):
            tried += 1
            folder = tmp / f"mixed-{other}-{split}"
            folder.mkdir()
            write(folder / "dev.json", _folder_records("hotpotqa", "validation-", 3))
            write(folder / "train.json", _folder_records("hotpotqa", "train-", 3))
            write(folder / other, _folder_records("hotpotqa", "other-", 3))
            try:
                load("hotpotqa", split, path=folder)
                print(f"  split mixed {other} {split}: loaded")
            except DataFormatError as exc:
                ok = str(folder) in str(exc) and other in str(exc)
                clean += ok
                if not ok:
                    print(f"  split mixed {other} {split}: {str(exc)[:120]}")
            except Exception as exc:
                print(f"  split mixed {other} {split}: {type(exc).__name__}: {str(exc)[:120]}")
    # names that declare no split: the folder is the split, read whole
    folder = tmp / "unnamed"
    folder.mkdir()
    write(folder / "a.json", _folder_records("hotpotqa", "a-", 3))
    write(folder / "b.json", _folder_records("hotpotqa", "b-", 4))
    for split in ("dev", "test", "train"):
        tried += 1
        try:
            clean += len(load("hotpotqa", split, path=folder)) == 7
        except Exception as exc:
            print(f"  split unnamed {split}: {type(exc).__name__}: {str(exc)[:120]}")
    # unknown splits everywhere a split is taken: SynthHop, a file, gym.make, the CLI
    for split in [*BAD_SPLITS, None, 3, ["dev"]]:
        for how in ("synthhop", "file", "gym.make"):
            tried += 1
            try:
                if how == "synthhop":
                    load("synthhop", split, n_passages=2000, n_questions=(40, 10, 10))
                elif how == "file":
                    path = tmp / "one.json"
                    write(path, _folder_records("hotpotqa", "x-", 2))
                    load("hotpotqa", split, path=path)
                else:
                    gym.make("rag_gym/SynthHop-v0", dataset_kwargs=SMALL, split=split)
                print(f"  split {how} {split!r}: accepted")
            except (TypeError, ValueError) as exc:
                ok = "expected" in str(exc) and "split" in str(exc)
                clean += ok
                if not ok:
                    print(f"  split {how} {split!r}: {str(exc)[:120]}")
            except Exception as exc:
                print(f"  split {how} {split!r}: {type(exc).__name__}: {str(exc)[:120]}")
    runner = CliRunner()
    path = tmp / "cli-hotpot.json"
    write(path, _folder_records("hotpotqa", "validation-", 3))
    for split in ("nosuch", "Dev", "tset"):
        for env_args in (
            [],  # SynthHop, the default env
            ["--env", "rag_gym/HotpotQA-v0", "--data-path", str(path)],
            ["--env", "rag_gym/HotpotQA-v0", "--data-path", str(tmp / "split-hotpotqa")],
        ):
            tried += 1
            out = tmp / f"cli-{split}-{len(env_args)}-{tried}"
            result = runner.invoke(
                app,
                [
                    "evaluate",
                    *env_args,
                    "--split",
                    split,
                    "--n",
                    "2",
                    "--agents",
                    "random",
                    "--out",
                    str(out),
                ],
            )
            ok = (
                result.exit_code == 2
                and "expected a split" in result.output
                and not any(out.rglob("protocol.json"))
            )
            clean += ok
            if not ok:
                print(
                    f"  split cli {env_args[:2]} {split!r}: exit {result.exit_code}: "
                    f"{result.output[-160:]!r}"
                )
    return tried, clean


# ---- a gold answer that normalises to nothing ------------------------------------------
EMPTY = [
    "",
    " ",
    "\t",
    "The",
    "the",
    "a.",
    "An!",
    "A",
    "an",
    "the the",
    "...",
    "'",
    "a an the",
    "_",
]
PREDICTIONS = ["an", "the", ".", "a", "", "Paris", "anything at all"]
#: dataset -> (field, how one bad answer is placed: sole answer / beside a good alias)
PLACES = {
    "hotpotqa": [("answer", lambda a: a)],
    "2wikimultihopqa": [("answer", lambda a: a)],
    "musique": [("answer", lambda a: a), ("answer_aliases", lambda a: ["Paris", a])],
    "flashrag": [
        ("golden_answers", lambda a: [a]),
        ("golden_answers", lambda a: ["Paris", a]),
        ("golden_answers", lambda a: a),
        ("answer", lambda a: a),
    ],
    "bamboogle": [("answer", lambda a: a), ("golden_answers", lambda a: ["Paris", a])],
}


def probe_empty_gold(tmp: Path) -> tuple[int, int]:
    """Every loader, every placement, every answer that normalises to nothing: clean when the
    load raises DataFormatError naming the file, the record and the field; the answer metrics
    must raise ValueError (never score 1) against such a gold; a QAExample (and so an env built
    from examples=) refuses one; unanswerable / unlabelled questions still load without answers."""
    tried = clean = n = 0
    for dataset, places in PLACES.items():
        name, rec = GOOD[dataset]
        for (field, place), answer in ((p, a) for p in places for a in EMPTY):
            tried += 1
            n += 1
            path = tmp / f"gold{n}-{name}"
            bad = {**rec, "_id": "b", "id": "b", "question": "b?"}
            if dataset == "flashrag" and field == "answer":
                bad.pop("golden_answers")  # golden_answers, when present, wins over answer
            bad[field] = place(answer)
            write(path, [rec, bad])
            where = "line 2" if name.endswith(".jsonl") else "record 1"
            try:
                got = load(dataset, path=path)
                print(f"  gold {dataset} {field}={place(answer)!r}: loaded {got[-1].answers!r}")
            except DataFormatError as exc:
                ok = path.name in str(exc) and where in str(exc) and field in str(exc)
                clean += ok
                if not ok:
                    print(f"  gold {dataset} {field}: {str(exc)[:140]}")
            except Exception as exc:
                print(f"  gold {dataset} {field}: {type(exc).__name__}: {str(exc)[:120]}")
    tsv = tmp / "gold.tsv"
    for answer in EMPTY:
        tried += 1
        tsv.write_text(f"Question\tAnswer\nq?\tParis\nr?\t{answer}\n")
        try:
            load("bamboogle", path=tsv)
            print(f"  gold bamboogle tsv {answer!r}: loaded")
        except DataFormatError as exc:
            clean += "gold.tsv, line 3, field 'Answer'" in str(exc)
        except Exception as exc:
            print(f"  gold tsv {answer!r}: {type(exc).__name__}: {str(exc)[:120]}")
    scorers = [
        metrics.exact_match,
        metrics.f1_score,
        metrics.cover_exact_match,
        metrics.sub_exact_match,
        metrics.answer_scores,
    ]
    for scorer in scorers:
        for gold in [*EMPTY, ["Paris", "The"], ("the",)]:
            for pred in PREDICTIONS:
                tried += 1
                try:
                    score = scorer(pred, gold)
                    print(f"  gold metric {scorer.__name__}({pred!r}, {gold!r}) = {score}")
                except ValueError as exc:
                    clean += "normalises to ''" in str(exc)
                except Exception as exc:
                    print(f"  gold metric {scorer.__name__}: {type(exc).__name__}: {exc}")
    for answer in EMPTY:
        tried += 1
        try:
            ex = QAExample("q1", "Who?", ("Paris", answer), ("p1",))
            print(f"  gold QAExample {answer!r}: made {ex.answers!r}")
        except ValueError as exc:
            clean += "q1" in str(exc) and "normalisation" in str(exc)
    # what must keep working: unanswerable and unlabelled questions, without answers
    _, mus = GOOD["musique"]
    keep = [
        ("musique", "m.jsonl", {**mus, "answerable": False, "answer": ""}),
        ("musique", "m.jsonl", {**mus, "answerable": False, "answer": "Paris"}),
        ("hotpotqa", "h.json", {k: v for k, v in GOOD["hotpotqa"][1].items() if k != "answer"}),
        ("flashrag", "f.jsonl", {**GOOD["flashrag"][1], "golden_answers": []}),
    ]
    for dataset, name, record in keep:
        tried += 1
        n += 1
        path = tmp / f"keep{n}-{name}"
        write(path, [record])
        try:
            load(dataset, path=path)
            clean += 1
        except Exception as exc:
            print(f"  gold keep {dataset}: {type(exc).__name__}: {str(exc)[:120]}")
    env = gym.make("rag_gym/SynthHop-Hard-v0", dataset_kwargs=SMALL)
    unans = [i for i, e in enumerate(env.unwrapped.examples) if not e.answerable]
    tried += 1
    env.reset(options={"question_index": unans[0]})
    _, reward, *_ = env.step({"type": 3, "text": ""})
    clean += reward == 1.0  # REFUSE on an unanswerable question still earns its reward
    return tried, clean


# ---- FlashRAG ids, reset options, pickle / deepcopy -----------------------------------
IDS = [True, False, "", " ", "\t\n", None, [], {}, 1.5, ["a"], {"a": 1}]


def probe_question_ids(tmp: Path) -> tuple[int, int]:
    """A question id that is a bool or empty, in every loader's id field: clean when refused with
    DataFormatError naming the file, the record and the id field (never read as "True")."""
    tried = clean = n = 0
    for dataset, (name, rec) in GOOD.items():
        key = "_id" if "_id" in rec else "id"
        for qid in IDS:
            tried += 1
            n += 1
            path = tmp / f"id{n}-{name}"
            write(path, [rec, {**rec, key: qid, "question": "b?"}])
            where = "line 2" if name.endswith(".jsonl") else "record 1"
            try:
                got = load(dataset, path=path)
                print(f"  id {dataset} {qid!r}: loaded as {got[-1].id!r}")
            except DataFormatError as exc:
                ok = path.name in str(exc) and where in str(exc) and f"'{key}'" in str(exc)
                clean += ok
                if not ok:
                    print(f"  id {dataset} {qid!r}: {str(exc)[:140]}")
            except Exception as exc:
                print(f"  id {dataset} {qid!r}: {type(exc).__name__}: {str(exc)[:120]}")
    return tried, clean


OPTIONS = [
    "index",
    "question_id",
    b"index",
    0,
    1.5,
    True,
    [("index", 0)],
    ("index",),
    {"index"},
    {"question_id": ["x"]},
    {"question_id": {"a": 1}},
    {"question_id": 3},
    {"question_id": None},
    {"question_id": b"x"},
    {"question_id": "no-such-id"},
    {"question_id": ""},
    {"index": True},
    {"index": False},
    {"index": 1.0},
    {"index": "1"},
    {"index": None},
    {"index": [1]},
    {"index": -1},
    {"index": 10**9},
    {"index": 2**70},
    {"index": float("nan")},
    {"index": 0, "question_id": "x"},
]


def probe_reset_options() -> tuple[int, int]:
    """Bad ``reset(options=...)`` on the search, tree and reader envs: clean when a TypeError or
    ValueError saying "expected" (or naming the missing id); ``pickle`` and ``deepcopy`` of each
    env: clean when a TypeError names what holds the module and says to gym.make(env.spec)."""
    import numpy as np

    tried = clean = 0
    kw = {"dataset_kwargs": SMALL}
    envs = {
        "search": gym.make("rag_gym/SynthHop-v0", **kw),
        "tree": gym.make("rag_gym/SynthHop-Tree-v0", **kw),
        "reader": gym.make("rag_gym/SynthHop-Reader-v0", **kw),
    }
    tree_opts = [{"index": 0, "context_ids": v} for v in ("p1", 5, [1], {"a": 1}, [None])]
    for name, env in envs.items():
        for options in (
            OPTIONS + [{"index": np.bool_(True)}] + (tree_opts if name == "tree" else [])
        ):
            tried += 1
            try:
                env.reset(seed=0, options=options)
                print(f"  options {name} {options!r}: accepted")
            except (TypeError, ValueError) as exc:
                ok = "expected" in str(exc) or "no question with id" in str(exc)
                clean += ok
                if not ok:
                    print(f"  options {name} {options!r}: {type(exc).__name__}: {str(exc)[:120]}")
            except Exception as exc:
                print(f"  options {name} {options!r}: {type(exc).__name__}: {str(exc)[:120]}")
        for copier in (pickle.dumps, copy.deepcopy, lambda e: pickle.dumps(e.unwrapped)):
            tried += 1
            try:
                copier(env)
                clean += 1  # a copy that works is fine too
            except TypeError as exc:
                ok = "holds" in str(exc) and "gym.make(env.spec)" in str(exc)
                clean += ok
                if not ok:
                    print(f"  pickle {name}: {str(exc)[:120]}")
            except Exception as exc:
                print(f"  pickle {name}: {type(exc).__name__}: {str(exc)[:120]}")
        env.close()
    return tried, clean


def probes(tmp: Path) -> dict[str, tuple[int, int]]:
    """(tried, handled cleanly) per category."""
    return {
        "folder data paths and split names": probe_split_folders(tmp),
        "gold answers that normalise to nothing": probe_empty_gold(tmp),
        "question ids (bool, empty)": probe_question_ids(tmp),
        "env reset options, pickle and deepcopy": probe_reset_options(),
    }

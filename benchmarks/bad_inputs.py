"""Bad inputs tried and handled cleanly, per area: data loaders, env arguments, env actions,
index build targets.

    python benchmarks/bad_inputs.py

Handled cleanly means:

* loaders: the file loads, or raises ``DataFormatError`` (or ``ValueError`` /
  ``FileNotFoundError``) whose message names the file. Anything else is a crash.
* env arguments: the env is made (and steps), or a ``TypeError`` / ``ValueError`` saying
  ``expected``.
* env actions (text, tree and reader envs): the step returns, its observation lies in the
  observation space, and it takes under a second.
* index build targets: the build succeeds without deleting anything of the user's, or refuses
  with ``FileExistsError`` and leaves the folder as it was (and no hidden folder beside it).

Index corruptions have their own script: ``benchmarks/index_corruption.py``.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import gymnasium as gym

import rag_gym  # noqa: F401
from rag_gym.data import Corpus, DataFormatError, Passage, load
from rag_gym.retrieval import BM25Retriever
from rag_gym.wrappers import TextActions

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
VALUES = [
    None,
    0,
    -1,
    10**400,
    1.5,
    float("nan"),
    True,
    "",
    " ",
    "x" * 100_000,
    [],
    [[]],
    {},
    {"a": 1},
]


def write(path: Path, records) -> None:
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    else:
        path.write_text(json.dumps(records))


def loader_inputs(tmp: Path):
    """(dataset, path) for every bad file: each field removed or set to each odd value, nested
    fields too, repeated ids, and damaged files."""
    n = 0
    for dataset, (name, rec) in GOOD.items():
        variants = []
        for key in rec:
            variants.append({k: v for k, v in rec.items() if k != key})
            variants += [{**rec, key: v} for v in VALUES]
            if isinstance(rec[key], list) and rec[key] and isinstance(rec[key][0], (dict, list)):
                inner = rec[key][0]
                keys = inner if isinstance(inner, dict) else range(len(inner))
                for ik, v in itertools.product(keys, VALUES):
                    copy = dict(inner) if isinstance(inner, dict) else list(inner)
                    copy[ik] = v
                    variants.append({**rec, key: [copy]})
        for records in [[v] for v in variants] + [[rec, rec], [rec, {**rec, "question": "b"}]]:
            n += 1
            path = tmp / f"{n}-{name}"
            write(path, records)
            yield dataset, path
        for raw in (
            b"",
            b"[]",
            b"{}",
            b"\xff\xfe",
            b"[" * 100_000,
            b"[" * 100_000 + b"]" * 100_000,
            b"{",
            b"null",
            b"1",
        ):
            n += 1
            path = tmp / f"{n}-{name}"
            path.write_bytes(raw if name.endswith(".json") else raw + b"\n")
            yield dataset, path


def probe_loaders(tmp: Path) -> tuple[int, int]:
    tried = clean = 0
    for dataset, path in loader_inputs(tmp):
        tried += 1
        try:
            load(dataset, path=path)
        except (DataFormatError, ValueError, FileNotFoundError) as exc:
            if path.name in str(exc):
                clean += 1
            else:
                print(f"  loader {dataset} {path.name}: unnamed: {str(exc)[:120]}")
            continue
        except Exception as exc:
            print(f"  loader {dataset} {path.name}: {type(exc).__name__}: {str(exc)[:120]}")
            continue
        clean += 1
    return tried, clean


def probe_env_args() -> tuple[int, int]:
    cases = [
        ("rag_gym/SynthHop-v0", {"invalid_action_penalty": v})
        for v in (float("nan"), float("inf"), "0", True)
    ]
    cases += [("rag_gym/SynthHop-v0", {"k": v}) for v in (0, -1, 10**6, 1.5, "3", None, True)]
    cases += [("rag_gym/SynthHop-v0", {"max_obs_chars": v}) for v in (0, 10**9, -5, "x")]
    cases += [("rag_gym/SynthHop-Tree-v0", {"k": v}) for v in (0, 10**6)]
    cases += [("rag_gym/SynthHop-Reader-v0", {"max_action_chars": v}) for v in (0, -1, "x")]
    extra = {
        "hops": [0, (), (0,), (5,), "2", None],
        "seed": [-1, 1.5, "x"],
        "n_questions": [5, (1, 2)],
    }
    extra["n_passages"] = [0, -5, "x"]
    for key, values in extra.items():
        cases += [("rag_gym/SynthHop-v0", {"dataset_kwargs": {**SMALL, key: v}}) for v in values]
    reset_seeds = [-1, 1.5, "x", 2**70]
    tried = clean = 0
    for env_id, kwargs in cases:
        tried += 1
        kwargs = {"dataset_kwargs": SMALL, **kwargs}
        try:
            env = gym.make(env_id, **kwargs)
            env.reset(seed=0)
            clean += 1
        except (TypeError, ValueError) as exc:
            ok = "expected" in str(exc)
            clean += ok
            if not ok:
                print(f"  env args {env_id} {kwargs}: {type(exc).__name__}: {str(exc)[:120]}")
        except Exception as exc:
            print(f"  env args {env_id} {kwargs}: {type(exc).__name__}: {str(exc)[:120]}")
    env = gym.make("rag_gym/SynthHop-v0", dataset_kwargs=SMALL)
    for seed in reset_seeds:
        tried += 1
        try:
            env.reset(seed=seed)
            clean += 1
        except (TypeError, ValueError) as exc:
            clean += "expected" in str(exc)
        except Exception as exc:
            print(f"  reset(seed={seed!r}): {type(exc).__name__}: {str(exc)[:120]}")
    return tried, clean


def probe_env_actions() -> tuple[int, int]:
    texts = [
        "<" + " " * 16_383,
        "<" + "\t" * 16_383 + "search>q</search>",
        "<search" + " " * 16_383,
        "<search" + " " * 16_383 + "/" + " " * 16_383,
        "< /" + " " * 16_383,
        "<" * 16_000,
        "<a" * 8_000,
        "</" * 8_000,
        "<relevance>[" + "9" * 5000 + "]</relevance><analysis>a</analysis><answer>x</answer>",
        "<relevance>" + "1," * 8000 + "</relevance>",
        "<relevance>[" + "0" * 5000 + "1]</relevance>",
        "<search>" * 4000,
        "<base-Q>" + "x " * 8000,
        "\x00\ud800\U0010ffff" * 100,
        "",
        "<answer></answer>",
        "<refuse" + " " * 10_000 + "/>",
    ]
    kw = {"dataset_kwargs": SMALL}
    envs = {
        "text": TextActions(gym.make("rag_gym/SynthHop-Hard-v0", **kw)),
        "tree": gym.make("rag_gym/SynthHop-Hard-Tree-v0", **kw),
        "reader": gym.make("rag_gym/SynthHop-Hard-Reader-v0", **kw),
    }
    tried = clean = 0
    for name, env in envs.items():
        for text in texts:
            tried += 1
            env.reset(seed=0)
            t0 = time.perf_counter()
            try:
                obs, *_ = env.step(text)
            except Exception as exc:
                print(f"  action {name} {text[:20]!r}: {type(exc).__name__}: {str(exc)[:100]}")
                continue
            took = time.perf_counter() - t0
            ok = env.observation_space.contains(obs) and took < 1.0
            clean += ok
            if not ok:
                print(f"  action {name} {text[:20]!r}: {took:.2f} s or obs outside the space")
    return tried, clean


def probe_build_targets(tmp: Path) -> tuple[int, int]:
    retriever = BM25Retriever(Corpus([Passage("a", "", "some words"), Passage("b", "", "more")]))
    tried = clean = 0

    def snapshot(root: Path):
        return sorted((p.relative_to(root).as_posix(), p.is_dir()) for p in root.rglob("*"))

    setups = {
        "folder with files": lambda d: (d.mkdir(), (d / "notes.txt").write_text("x")),
        "folder with a subfolder": lambda d: (d / "sub").mkdir(parents=True),
        "a file": lambda d: d.write_text("keep"),
        "a symlink to a folder": lambda d: (
            (d.parent / "real").mkdir() or d.symlink_to(d.parent / "real")
        ),
        "an index holding a user file": lambda d: (
            retriever.save(d),
            (d / "mine.txt").write_text("x"),
        ),
        "an index with a user subfolder": lambda d: (
            retriever.save(d),
            (d / "bm25s" / "x").mkdir(),
        ),
        "a folder whose params.json is not an index's": lambda d: (
            d.mkdir(),
            (d / "params.json").write_text('{"lr": 0.1}'),
        ),
        "a folder with a garbled params.json": lambda d: (
            d.mkdir(),
            (d / "params.json").write_bytes(b"\xff{"),
        ),
        "an empty folder": lambda d: d.mkdir(),
        "an index": lambda d: retriever.save(d),
        "a missing parent": lambda d: None,
    }
    for i, (label, setup) in enumerate(setups.items()):
        root = tmp / f"target{i}"
        root.mkdir()
        d = root / "idx" if label != "a missing parent" else root / "a" / "b" / "idx"
        setup(d)
        before = snapshot(root)
        tried += 1
        try:
            retriever.save(d)
            user_files = [p for p, is_dir in before if not p.startswith("idx/") and p != "idx"]
            after = {p for p, _ in snapshot(root)}
            ok = all(p in after for p in user_files) and not any(p.startswith(".") for p in after)
            ok = ok and label in ("an empty folder", "an index", "a missing parent")
        except FileExistsError:
            ok = snapshot(root) == before
        except Exception as exc:
            print(f"  build into {label}: {type(exc).__name__}: {str(exc)[:120]}")
            ok = False
        clean += ok
        if not ok:
            print(f"  build into {label}: not clean")
    return tried, clean


def main() -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        results = {
            "data loaders": probe_loaders(tmp),
            "env arguments": probe_env_args(),
            "env actions (text, tree, reader)": probe_env_actions(),
            "index build targets": probe_build_targets(tmp),
        }
    print()
    print("| area | tried | handled cleanly |")
    print("|---|---:|---:|")
    for area, (tried, clean) in results.items():
        print(f"| {area} | {tried} | {clean} ({100 * clean / tried:.1f} %) |")
    sys.exit(0 if all(t == c for t, c in results.values()) else 1)


if __name__ == "__main__":
    main()

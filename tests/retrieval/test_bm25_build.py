"""The out-of-core BM25 build: byte-identical to the in-memory build under a small memory budget,
the same scores as bm25s's own index, a killed build leaves nothing that loads, and the
memory-mapped index answers exactly as the in-memory one."""

from __future__ import annotations

import importlib.util
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import bm25s
import numpy as np
import pytest
import Stemmer

from rag_gym.data import Corpus, Passage
from rag_gym.data.synthhop import SynthHopConfig, generate
from rag_gym.data.types import iter_corpus_jsonl
from rag_gym.retrieval import BM25Retriever
from rag_gym.retrieval.bm25 import BM25Config
from rag_gym.retrieval.bm25_build import build_bm25_index, parse_memory
from rag_gym.retrieval.load import load_index

needs_numba = pytest.mark.skipif(
    importlib.util.find_spec("numba") is None, reason="needs numba: pip install 'rag-gym[fast]'"
)
ROOT = Path(__file__).resolve().parents[2]


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory) -> Path:
    """A 100k-passage SynthHop world as an {id, contents} JSONL (wiki-18's format)."""
    world = generate(SynthHopConfig(n_passages=100_000, n_questions=(40, 10, 10)))
    path = tmp_path_factory.mktemp("corpus") / "world.jsonl"
    world.corpus.to_jsonl(path, fmt="contents")
    return path


@needs_numba
@pytest.mark.slow
def test_out_of_core_build_is_byte_identical_to_in_memory(corpus_file, tmp_path):
    corpus = Corpus.from_jsonl(corpus_file)
    BM25Retriever(corpus).save(tmp_path / "memory")
    passages = (p for _, p in iter_corpus_jsonl(corpus_file))
    # 4 MB of postings: about 87k postings a run, so the 100k passages spill dozens of runs
    build_bm25_index(passages, tmp_path / "disk", memory="4MB", corpus_name=corpus_file.stem)
    memory, disk = tree_bytes(tmp_path / "memory"), tree_bytes(tmp_path / "disk")
    assert sorted(memory) == sorted(disk)
    assert "serving/block_max.npy" in disk and "bm25s/data.csc.index.npy" in disk
    for name in memory:
        assert memory[name] == disk[name], name
    assert not list(tmp_path.glob(".*"))  # no temporary folder left behind


@pytest.mark.parametrize("method", ["lucene", "robertson", "atire", "bm25l", "bm25+"])
def test_scores_equal_bm25s_own_index(method):
    rng = random.Random(1)
    words = ["apple", "pear", "plum", "red", "trees", "running", "runs", "the", "x", "Ada"]
    corpus = Corpus(
        [
            Passage(
                f"d{i}",
                rng.choice(["", "Title"]),
                " ".join(rng.choices(words, k=rng.randint(0, 20))),
            )
            for i in range(300)
        ]
    )
    ours = BM25Retriever(corpus, BM25Config(method=method), backend="numpy")
    stemmer = Stemmer.Stemmer("english")
    raw = bm25s.BM25(method=method)
    raw.index(
        bm25s.tokenize(corpus.contents(), stopwords="en", stemmer=stemmer, show_progress=False),
        show_progress=False,
    )
    for query in ["apple pear", "running trees", "red red plum ada", "the apple x"]:
        tokens = bm25s.tokenize(
            [query], stopwords="en", stemmer=stemmer, return_ids=False, show_progress=False
        )[0]
        expected = raw.get_scores(tokens)
        got = ours.scores(query)
        assert got.dtype == expected.dtype
        assert np.array_equal(got, expected), (method, query)  # bit for bit


@needs_numba
@pytest.mark.slow
def test_mmap_load_answers_as_in_memory(corpus_file, tmp_path):
    corpus = Corpus.from_jsonl(corpus_file)
    in_memory = BM25Retriever(corpus)
    build_bm25_index((p for _, p in iter_corpus_jsonl(corpus_file)), tmp_path / "idx", memory="8MB")
    mapped = BM25Retriever.load(tmp_path / "idx")
    for array in (
        mapped._data,
        mapped._blocks["block_max"],
        mapped._blocks["block_rank"],
        mapped._id_rank,
        mapped.model.vocab_dict._table,
    ):  # views of the mapped files, never copies
        assert _mapped(array)
    rng = random.Random(0)
    queries = [" ".join(rng.sample(corpus.texts[i].split(), 3)) for i in range(0, 100_000, 997)]
    queries += ["", "the of", "guild " * 40]
    exclude = [rng.sample(corpus.ids, 3) for _ in queries]
    pools = [rng.sample(corpus.ids, 20) if i % 4 == 0 else None for i in range(len(queries))]
    for kwargs in ({}, {"exclude": exclude}, {"within": pools}):
        for k in (1, 3, 10):
            assert mapped.retrieve(queries, k, **kwargs) == in_memory.retrieve(queries, k, **kwargs)


@needs_numba
@pytest.mark.slow
def test_index_saved_before_block_rank_loads_and_answers_the_same(corpus_file, tmp_path):
    """An index written before serving/block_rank.npy existed (no such file, nor in the
    manifest) loads, computes each block's smallest id rank on its first query, and answers
    exactly as one that has it."""
    import json

    from rag_gym.retrieval import _bm25_numba
    from rag_gym.retrieval.persist import _params_digest

    corpus = Corpus.from_jsonl(corpus_file)
    build_bm25_index((p for _, p in iter_corpus_jsonl(corpus_file)), tmp_path / "new")
    build_bm25_index((p for _, p in iter_corpus_jsonl(corpus_file)), tmp_path / "old")
    old = tmp_path / "old"
    (old / "serving" / "block_rank.npy").unlink()
    params = json.loads((old / "params.json").read_text())
    manifest = params["files"]
    manifest.pop("serving/block_rank.npy")
    params["params_sha256"] = _params_digest(params)  # as an index of that time was written
    (old / "params.json").write_text(json.dumps(params))
    new_ix, old_ix = BM25Retriever.load(tmp_path / "new"), BM25Retriever.load(old)
    assert "block_rank" not in old_ix._blocks
    queries = [" ".join(corpus.texts[i].split()[:4]) for i in range(0, 100_000, 1999)]
    for k in (1, 3, 10):
        assert old_ix.retrieve(queries, k) == new_ix.retrieve(queries, k)
    blocks = new_ix._blocks
    expected = _bm25_numba.block_min_rank(new_ix._indices, new_ix._indptr, blocks, new_ix._id_rank)
    assert np.array_equal(old_ix._blocks["block_rank"], expected)
    assert np.array_equal(blocks["block_rank"], expected)


@needs_numba
@pytest.mark.slow
def test_killed_build_leaves_nothing_that_loads(corpus_file, tmp_path):
    out = tmp_path / "idx"
    cmd = [
        sys.executable,
        "-m",
        "rag_gym.cli",
        "index",
        "build",
        "--corpus",
        str(corpus_file),
        "--out",
        str(out),
        "--memory",
        "2MB",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    # kill it once it has spilled runs, mid-build
    while not list(tmp_path.glob(".idx.tmp-*/.runs/run00003-ptr.npy")):
        assert proc.poll() is None, "the build ended before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not out.exists()
    with pytest.raises(ValueError, match="is not a rag-gym index"):
        load_index(out)
    assert list(tmp_path.glob(".idx.tmp-*"))  # the leftover, under a temporary name
    # the next build removes the dead build's leftovers and succeeds
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert not list(tmp_path.glob(".idx.*"))
    retriever, kind = load_index(out, verify=True)
    assert kind == "bm25" and len(retriever.corpus) == len(Corpus.from_jsonl(corpus_file))


def test_memory_budget_errors(tmp_path):
    assert parse_memory("1.5G") == 3 * 2**29
    with pytest.raises(ValueError, match=r"expected a memory budget such as '4GB'.*got 'lots'"):
        parse_memory("lots")
    with pytest.raises(ValueError, match="at least 1MB, got 1000 bytes"):
        parse_memory(1000)
    with pytest.raises(TypeError, match="expected a memory budget such as '4GB', got float"):
        parse_memory(2.5)
    duplicated = [Passage("a", "", "red apple"), Passage("b", "", "pear"), Passage("a", "", "x")]
    with pytest.raises(ValueError, match="the id 'a' appears more than once"):
        build_bm25_index(iter(duplicated), tmp_path / "idx", memory="1MB")
    assert not (tmp_path / "idx").exists() and not list(tmp_path.glob(".idx.*"))


def test_cli_names_a_bad_budget(tmp_path):
    corpus = tmp_path / "c.jsonl"
    Corpus([Passage("a", "", "red apple"), Passage("b", "", "pear")]).to_jsonl(corpus)
    args = ["--corpus", str(corpus), "--out", str(tmp_path / "idx"), "--memory", "lots"]
    proc = subprocess.run(
        [sys.executable, "-m", "rag_gym.cli", "index", "build", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "expected a memory budget such as '4GB'" in proc.stderr
    assert not (tmp_path / "idx").exists()


def _mapped(array) -> bool:
    """Whether ``array`` is a view of an ``np.memmap`` (a file mapped, not read)."""
    while array is not None:
        if isinstance(array, np.memmap):
            return True
        array = getattr(array, "base", None)
    return False

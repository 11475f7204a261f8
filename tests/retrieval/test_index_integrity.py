"""Index folders are bound to their corpus: every file is checksummed and checked on load, and an
index build replaces only an index (issue 12, items 1 and 6)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rag_gym.data import Corpus, Passage
from rag_gym.data.synthhop import world_for
from rag_gym.retrieval import BM25Retriever, persist
from rag_gym.retrieval.load import load_index
from tests.conftest import SMALL_WORLD
from tests.retrieval.index_tools import edit_params, reseal


@pytest.fixture(scope="module")
def world():
    return world_for("default", **SMALL_WORLD)


@pytest.fixture(scope="module")
def two_indexes(world, tmp_path_factory):
    """Two BM25 indexes of the same size over different corpora (arrays of the same shapes):
    the second gives each passage id the next passage's text."""
    root = tmp_path_factory.mktemp("two")
    corpus = world.corpus
    texts = corpus.texts[1:] + corpus.texts[:1]
    titles = corpus.titles[1:] + corpus.titles[:1]
    other = Corpus.from_columns(corpus.ids, titles, texts, name="rotated")
    a = BM25Retriever(corpus).save(root / "a")
    b = BM25Retriever(other).save(root / "b")
    return a, b


def fresh(src: Path, tmp_path: Path) -> Path:
    out = tmp_path / "idx"
    shutil.copytree(src, out)
    return out


# ---- every file is bound to the index ---------------------------------------------------------
def test_every_file_is_in_the_manifest(two_indexes):
    a, _ = two_indexes
    params = json.loads((a / "params.json").read_text())
    on_disk = {p.relative_to(a).as_posix() for p in a.rglob("*") if p.is_file()}
    assert set(params["files"]) == on_disk - {"params.json"}
    assert {"corpus.jsonl", "bm25s/data.csc.index.npy", "bm25s/vocab.index.json"} <= on_disk
    assert params["format"] == persist.FORMAT and len(params["params_sha256"]) == 64


@pytest.mark.parametrize("name", ["data.csc.index.npy", "indices.csc.index.npy"])
def test_arrays_of_another_same_size_index_are_refused(two_indexes, tmp_path, name):
    a, b = two_indexes
    mine, theirs = (a / "bm25s" / name).read_bytes(), (b / "bm25s" / name).read_bytes()
    assert len(mine) == len(theirs) and mine != theirs
    out = fresh(a, tmp_path)
    shutil.copy(b / "bm25s" / name, out / "bm25s" / name)
    with pytest.raises(ValueError, match=rf"bm25s/{name} does not match its checksum"):
        BM25Retriever.load(out)


@pytest.mark.parametrize("verify", [False, True])
@pytest.mark.parametrize(
    "name", ["bm25s/data.csc.index.npy", "bm25s/vocab.index.json", "corpus.jsonl"]
)
def test_a_flipped_byte_is_an_error_naming_the_file(two_indexes, tmp_path, name, verify):
    a, _ = two_indexes
    out = fresh(a, tmp_path)
    raw = bytearray((out / name).read_bytes())
    raw[len(raw) // 2] ^= 0x01
    (out / name).write_bytes(bytes(raw))
    # (past the sampled size, the corpus's own checks may be the ones to name it)
    if name == "corpus.jsonl" and not verify and not _sampled(out / name, len(raw) // 2):
        # a mapped corpus reads no passage at load: the damaged line is refused when read
        corpus = BM25Retriever.load(out).corpus
        with pytest.raises(
            ValueError, match=r"corpus\.jsonl line \d+ is damaged .*rebuild the index"
        ):
            for pid in corpus.ids:
                corpus[pid]
        return
    with pytest.raises(ValueError, match=rf"{name}\b.*rebuild the index"):
        BM25Retriever.load(out, verify=verify)


def _sampled(path: Path, offset: int) -> bool:
    """Whether the load's sampled checksum reads the byte at ``offset``."""
    starts = persist._sample_starts(path.stat().st_size)
    return starts is None or any(s <= offset < s + persist._BLOCK for s in starts)


def test_a_damaged_passage_between_sampled_blocks_is_refused_when_read(tmp_path):
    # a mapped corpus is read on access; each line is checked against its build-time CRC-32
    corpus = Corpus(
        [Passage(f"p{i:05d}", f"T{i}", f"word{i} common text {i % 97}") for i in range(20_000)]
    )
    out = BM25Retriever(corpus).save(tmp_path / "big")
    path = out / "corpus.jsonl"
    raw = bytearray(path.read_bytes())
    starts = persist._sample_starts(len(raw))
    assert starts is not None  # past the sampled size
    offset = (starts[0] + persist._BLOCK + starts[1]) // 2  # between blocks 0 and 1
    assert not _sampled(path, offset)
    line = raw[:offset].count(b"\n")  # 0-based line of the flipped byte
    raw[offset] ^= 0x01
    path.write_bytes(bytes(raw))
    loaded = BM25Retriever.load(out).corpus
    assert loaded[f"p{line + 1:05d}"] == corpus[f"p{line + 1:05d}"]  # the others read fine
    with pytest.raises(ValueError, match=rf"corpus\.jsonl line {line + 1} is damaged \(its CRC-32"):
        loaded[f"p{line:05d}"]
    with pytest.raises(ValueError, match=r"corpus\.jsonl"):
        BM25Retriever.load(out, verify=True)


def test_verify_reads_every_byte_of_a_large_file(tmp_path):
    # past the sampled size, a byte between the sampled blocks escapes the fast check only
    corpus = Corpus([Passage(f"p{i}", "", f"word{i} common text {i % 97}") for i in range(40_000)])
    out = BM25Retriever(corpus).save(tmp_path / "big")
    path = out / "bm25s" / "data.csc.index.npy"
    size = path.stat().st_size
    assert size > persist._SAMPLE_WHOLE
    step = (size - persist._BLOCK) // (persist._SAMPLE_BLOCKS - 1)
    offset = persist._BLOCK + (step - persist._BLOCK) // 2  # between blocks 0 and 1
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 0x01
    path.write_bytes(bytes(raw))
    BM25Retriever.load(out)  # fast: sizes and sampled blocks
    with pytest.raises(ValueError, match=r"data\.csc\.index\.npy does not match its checksum"):
        BM25Retriever.load(out, verify=True)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"config": {"stemmer": None}}, "params_sha256"),
        ({"corpus_size": 1}, "params_sha256"),
        ({"rag_gym_version": "9.9"}, "params_sha256"),
    ],
)
def test_an_edited_params_file_is_refused(two_indexes, tmp_path, change, match):
    a, _ = two_indexes
    out = fresh(a, tmp_path)
    params = json.loads((out / "params.json").read_text())
    key, value = next(iter(change.items()))
    params[key] = {**params[key], **value} if isinstance(value, dict) else value
    (out / "params.json").write_text(json.dumps(params, indent=2))
    with pytest.raises(ValueError, match=rf"params\.json was edited or damaged.*{match}"):
        BM25Retriever.load(out)


def test_an_edited_tokenizer_config_is_refused_even_when_resealed(two_indexes, tmp_path):
    a, _ = two_indexes
    out = fresh(a, tmp_path)
    bm25s_params = out / "bm25s" / "params.index.json"
    bm25s_params.write_text(bm25s_params.read_text().replace('"k1": 1.5', '"k1": 0.5'))
    with pytest.raises(ValueError, match=r"bm25s/params\.index\.json (has|does not match)"):
        BM25Retriever.load(out)
    out = fresh(a, tmp_path / "2")
    edit_params(out, config={**json.loads((a / "params.json").read_text())["config"], "b": 2.0})
    with pytest.raises(ValueError, match=r"params\.json: bad BM25 config \(expected k1 >= 0"):
        BM25Retriever.load(out)


@pytest.mark.parametrize(
    ("damage", "match"),
    [
        ("delete bm25s/indptr.csc.index.npy", r"bm25s/indptr\.csc\.index\.npy is missing"),
        ("delete corpus.jsonl", r"corpus\.jsonl is missing"),
        ("truncate bm25s/indices.csc.index.npy", r"indices\.csc\.index\.npy has \d+ bytes"),
        ("truncate params.json", r"params\.json is not valid JSON"),
        ("empty params.json", r"params\.json is not valid JSON"),
        ("garble params.json", r"params\.json is not valid JSON"),
        ("list params.json", r"params\.json: expected a JSON object"),
        ("deep params.json", r"params\.json is not valid JSON"),
        ("delete params.json", r"params\.json is missing"),
        ("delete folder", r"no such folder"),
    ],
)
def test_damaged_folders_name_the_file(two_indexes, tmp_path, damage, match):
    a, _ = two_indexes
    out = fresh(a, tmp_path)
    action, _, name = damage.partition(" ")
    path = out / name
    if action == "delete" and name == "folder":
        shutil.rmtree(out)
    elif action == "delete":
        path.unlink()
    elif action == "truncate":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif action == "empty":
        path.write_bytes(b"")
    elif action == "garble":
        path.write_bytes(b"\xff\xfe{")
    elif action == "list":
        path.write_text("[1, 2]")
    elif action == "deep":
        path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match=match):
        BM25Retriever.load(out)
    with pytest.raises(ValueError, match=match):  # the server's and the env's loader
        load_index(out)


def test_an_index_of_the_old_format_says_rebuild(two_indexes, tmp_path):
    a, _ = two_indexes
    out = fresh(a, tmp_path)
    params = json.loads((out / "params.json").read_text())
    for key in ("format", "files", "params_sha256"):
        del params[key]
    (out / "params.json").write_text(json.dumps(params))
    with pytest.raises(ValueError, match=r"expected an index of format 2 .*got format 1.*rebuild"):
        BM25Retriever.load(out)


def test_the_env_refuses_a_corrupt_index(two_indexes, tmp_path):
    import gymnasium as gym

    import rag_gym  # noqa: F401

    a, b = two_indexes
    out = fresh(a, tmp_path)
    shutil.copy(b / "bm25s" / "data.csc.index.npy", out / "bm25s" / "data.csc.index.npy")
    with pytest.raises(ValueError, match=r"data\.csc\.index\.npy does not match its checksum"):
        gym.make("rag_gym/SynthHop-v0", dataset_kwargs=SMALL_WORLD, index=str(out))


def test_serve_refuses_a_corrupt_index_with_a_message(two_indexes, tmp_path):
    a, _ = two_indexes
    out = fresh(a, tmp_path)
    (out / "bm25s" / "vocab.index.json").write_text("{}")
    proc = subprocess.run(
        [sys.executable, "-m", "rag_gym.cli", "serve", "--index", str(out), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "vocab.index.json has" in proc.stderr and "rebuild the index" in proc.stderr


# ---- dense: the encoder that built the index ----------------------------------------------------
needs_faiss = pytest.mark.skipif(
    importlib.util.find_spec("faiss") is None, reason="needs faiss: pip install 'rag-gym[dense]'"
)
WORDS = ["apple", "pear", "red", "green", "wine"]


def encoder(texts):
    return np.array(
        [[t.lower().count(w) + 0.01 * j for j, w in enumerate(WORDS)] for t in texts],
        dtype=np.float32,
    )


def other_encoder(texts):  # same dimension, different vectors
    return encoder(texts)[:, ::-1].copy()


DENSE_CORPUS = Corpus(
    [Passage("d1", "", "red apple"), Passage("d2", "", "green pear"), Passage("d3", "", "wine")]
)


@needs_faiss
def test_a_dense_index_accepts_only_its_encoder_unless_told(tmp_path):
    from rag_gym.retrieval.dense import DenseRetriever

    out = DenseRetriever(DENSE_CORPUS, encoder=encoder).save(tmp_path / "dense")
    DenseRetriever.load(out, encoder=encoder)
    with pytest.raises(ValueError, match=r"the encoder given embeds its probe texts differently"):
        DenseRetriever.load(out, encoder=other_encoder)
    loaded = DenseRetriever.load(out, encoder=other_encoder, check_encoder=False)
    assert len(loaded.retrieve(["red"], k=1).ids[0]) == 1
    with pytest.raises(ValueError, match=r"3-dimensional vectors"):
        DenseRetriever.load(out, encoder=lambda texts: encoder(texts)[:, :3].copy())


@needs_faiss
def test_a_dense_index_with_another_index_files_is_refused(tmp_path):
    from rag_gym.retrieval.dense import DenseRetriever

    a = DenseRetriever(DENSE_CORPUS, encoder=encoder).save(tmp_path / "a")
    other = Corpus([Passage(p.id, "", p.text + " red") for p in DENSE_CORPUS])
    b = DenseRetriever(other, encoder=encoder).save(tmp_path / "b")
    for name in ("embeddings.npy", "faiss.index"):
        out = tmp_path / f"mixed-{name}"
        shutil.copytree(a, out)
        shutil.copy(b / name, out / name)
        with pytest.raises(ValueError, match=rf"{name} does not match its checksum"):
            DenseRetriever.load(out, encoder=encoder)
    out = tmp_path / "probe"
    shutil.copytree(a, out)
    edit_params(out, encoder_probe=[[1.0, 0, 0, 0, 0]] * 3)
    with pytest.raises(ValueError, match=r"params\.json: the index was built by .*differently"):
        DenseRetriever.load(out, encoder=encoder)


# ---- index build replaces only an index -------------------------------------------------------
def build(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rag_gym.cli", "index", "build", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "c.jsonl"
    Corpus(
        [Passage(f"p{i}", f"T{i}", f"passage number {i} about topic {i % 7}") for i in range(50)]
    ).to_jsonl(path)
    return path


def test_build_refuses_a_folder_that_is_not_an_index(corpus_file, tmp_path):
    d = tmp_path / "d"
    (d / "sub").mkdir(parents=True)
    (d / "notes.txt").write_text("x")
    proc = build("--corpus", str(corpus_file), "--out", str(d))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "is not a rag-gym index" in proc.stderr and "--force" in proc.stderr
    assert (d / "notes.txt").read_text() == "x" and (d / "sub").is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]  # nothing hidden left behind
    file = tmp_path / "f.txt"
    file.write_text("keep")
    proc = build("--corpus", str(corpus_file), "--out", str(file))
    assert proc.returncode == 2 and "is a file, not an index folder" in proc.stderr
    assert file.read_text() == "keep"


@pytest.mark.slow
def test_build_replaces_an_index_and_leaves_no_debris(corpus_file, tmp_path):
    d = tmp_path / "idx"
    assert build("--corpus", str(corpus_file), "--out", str(d)).returncode == 0
    (d / "bm25s" / "data.csc.index.npy").write_bytes(b"")  # even a damaged index is replaced
    proc = build("--corpus", str(corpus_file), "--out", str(d), "--verify")
    assert proc.returncode == 0, proc.stderr
    assert len(BM25Retriever.load(d, verify=True).corpus) == 50
    assert sorted(p.name for p in tmp_path.iterdir()) == ["idx"]
    (d / "mine.txt").write_text("x")  # an index folder holding a file of the user's
    proc = build("--corpus", str(corpus_file), "--out", str(d))
    assert (
        proc.returncode == 2 and "also holds files that are not its own (mine.txt)" in proc.stderr
    )
    assert (d / "mine.txt").exists()


def test_build_with_force_replaces_anything(corpus_file, tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    (d / "notes.txt").write_text("x")
    proc = build("--corpus", str(corpus_file), "--out", str(d), "--force")
    assert proc.returncode == 0, proc.stderr
    assert not (d / "notes.txt").exists() and BM25Retriever.load(d).corpus.ids[0] == "p0"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]


def test_save_refuses_a_folder_that_is_not_an_index(tmp_path):
    retriever = BM25Retriever(Corpus([Passage("a", "", "some words here")]))
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "data.csv").write_text("1,2")
    with pytest.raises(FileExistsError, match=r"x exists and is not a rag-gym index .*data\.csv"):
        retriever.save(tmp_path / "x")
    retriever.save(tmp_path / "empty-is-fine")
    (tmp_path / "empty-is-fine" / "bm25s" / "mine").mkdir()  # even an empty folder of the user's
    with pytest.raises(FileExistsError, match=r"not its own \(bm25s/mine\)"):
        retriever.save(tmp_path / "empty-is-fine")
    retriever.save(tmp_path / "x", force=True)
    assert not (tmp_path / "x" / "data.csv").exists()


def test_a_killed_build_leaves_nothing_the_next_build_keeps(tmp_path):
    retriever = BM25Retriever(Corpus([Passage("a", "", "some words here")]))
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    pid = int(dead.stdout)
    for kind in ("tmp", "old"):
        (tmp_path / f".idx.{kind}-{pid}").mkdir()
    (tmp_path / f".idx.tmp-{os.getppid()}").mkdir()  # a live process's: kept
    retriever.save(tmp_path / "idx")
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == [f".idx.tmp-{os.getppid()}", "idx"]


def test_an_index_without_a_corpus_map_reads_its_corpus_whole(two_indexes, world, tmp_path):
    # an index written before corpus maps: the same answers from a Corpus read at load
    a, _ = two_indexes
    out = fresh(a, tmp_path)
    shutil.rmtree(out / "corpus_map")
    reseal(out)
    legacy, mapped = BM25Retriever.load(out), BM25Retriever.load(a)
    assert type(legacy.corpus) is Corpus and type(mapped.corpus).__name__ == "MappedCorpus"
    queries = [q.question for q in world.questions["validation"]][:20]
    pools = [list(q.supporting_ids) + world.corpus.ids[:5] for q in world.questions["validation"]][
        :20
    ]
    for kwargs in ({}, {"within": pools}, {"exclude": [world.corpus.ids[:3]] * len(queries)}):
        got, want = legacy.retrieve(queries, k=3, **kwargs), mapped.retrieve(queries, k=3, **kwargs)
        assert got.ids == want.ids and got.scores == want.scores
    assert [legacy.corpus[i] for i in got.ids[0]] == [mapped.corpus[i] for i in got.ids[0]]
    # and a damaged corpus is still caught at load, through its content checksum
    raw = bytearray((out / "corpus.jsonl").read_bytes())
    raw[raw.index(b'"text": "', len(raw) // 2) + 12] ^= 0x01  # a letter of a passage's text
    (out / "corpus.jsonl").write_bytes(bytes(raw))
    reseal(out)
    with pytest.raises(ValueError, match=r"corpus\.jsonl does not match .*rebuild the index"):
        BM25Retriever.load(out)

"""BM25 through bm25s: same scores as the raw library, batching, exclusion, pools, ties."""

from __future__ import annotations

import bm25s
import numpy as np
import pytest
import Stemmer

from rag_gym.data import Corpus, Passage
from rag_gym.data.synthhop import SynthHopConfig, generate
from rag_gym.retrieval import BM25Retriever


@pytest.fixture(scope="module")
def world():
    return generate(SynthHopConfig(n_passages=2000, n_questions=(40, 10, 10)))


@pytest.fixture(scope="module")
def bm25(world):
    return BM25Retriever(world.corpus)


def test_matches_raw_bm25s(world, bm25):
    stemmer = Stemmer.Stemmer("english")
    raw = bm25s.BM25()
    raw.index(
        bm25s.tokenize(
            world.corpus.contents(), stopwords="en", stemmer=stemmer, show_progress=False
        ),
        show_progress=False,
    )
    queries = [q.question for q in world.questions["train"][:20]]
    tokens = bm25s.tokenize(
        queries, stopwords="en", stemmer=stemmer, show_progress=False, return_ids=False
    )
    ours = bm25.retrieve(queries, k=5)
    ids = world.corpus.ids
    for i, toks in enumerate(tokens):
        scores = raw.get_scores(toks)  # bm25s's own scores for every passage
        expected = sorted(range(len(ids)), key=lambda d: (-scores[d], ids[d]))[:5]
        assert ours.ids[i] == [ids[d] for d in expected]
        np.testing.assert_allclose(ours.scores[i], scores[expected], rtol=1e-6)


def test_first_hop_is_found(world, bm25):
    questions = world.questions["validation"]
    result = bm25.retrieve([q.question for q in questions], k=3)
    hits = sum(q.supporting_ids[0] in ids for q, ids in zip(questions, result.ids, strict=True))
    assert hits >= 0.8 * len(questions)


def test_batch_equals_single(world, bm25):
    queries = [q.question for q in world.questions["train"][:8]]
    batch = bm25.retrieve(queries, k=4)
    for i, q in enumerate(queries):
        single = bm25.retrieve([q], k=4)
        assert single.ids[0] == batch.ids[i] and single.scores[0] == batch.scores[i]


def test_ties_broken_by_id():
    # identical texts -> identical scores -> id order, whatever the corpus order
    corpus = Corpus(
        [Passage(pid, "", "red apple") for pid in ["d9", "d2", "d5", "d1"]]
        + [Passage("z", "", "pear")]
    )
    bm25 = BM25Retriever(corpus)
    assert bm25.retrieve(["apple"], k=3).ids == [["d1", "d2", "d5"]]
    # an empty query scores everything 0: pure id order
    assert bm25.retrieve([""], k=2).ids == [["d1", "d2"]]


def test_exclude_and_within(world, bm25):
    q = world.questions["validation"][0]
    top = bm25.retrieve([q.question], k=3).ids[0]
    excluded = bm25.retrieve([q.question], k=3, exclude=[top[:1]]).ids[0]
    assert top[0] not in excluded and excluded[:2] == top[1:]
    pool = [p.id for p in q.passages]
    inside = bm25.retrieve([q.question], k=3, within=[pool]).ids[0]
    assert set(inside) <= set(pool) and len(inside) == 3
    # ranking within the pool equals the corpus ranking filtered to the pool
    full = bm25.retrieve([q.question], k=len(world.corpus)).ids[0]
    assert inside == [pid for pid in full if pid in set(pool)][:3]
    # exclusion can exhaust a pool: fewer results, never a skipped error
    assert bm25.retrieve([q.question], k=10, within=[pool], exclude=[pool[:8]]).ids[0] == [
        pid for pid in full if pid in set(pool[8:])
    ]


def test_errors(bm25):
    with pytest.raises(
        ValueError, match=r"expected k <= 2000 \(the size of the corpus\), got k=2001"
    ):
        bm25.retrieve(["x"], k=2001)
    with pytest.raises(ValueError, match="expected k >= 1"):
        bm25.retrieve(["x"], k=0)
    with pytest.raises(TypeError, match="got a single str"):
        bm25.retrieve("x", k=1)
    with pytest.raises(ValueError, match=r"expected k <= 2 \(the size of the candidate pool\)"):
        bm25.retrieve(["x"], k=3, within=[["P0000001", "P0000002"]])
    with pytest.raises(KeyError, match="id 'nope' is not in the corpus"):
        bm25.retrieve(["x"], k=1, within=[["nope"]])
    with pytest.raises(
        ValueError, match=r"expected exclude to have one entry per query \(1\), got 2"
    ):
        bm25.retrieve(["x"], k=1, exclude=[[], []])
    with pytest.raises(ValueError, match="expected a non-empty corpus"):
        BM25Retriever(Corpus())


def test_save_load_roundtrip(world, bm25, tmp_path):
    out = bm25.save(tmp_path / "idx")
    assert {p.name for p in out.iterdir()} == {"bm25s", "corpus.jsonl", "params.json"}
    queries = [q.question for q in world.questions["validation"]]
    for mmap in (True, False):
        loaded = BM25Retriever.load(out, mmap=mmap)
        assert loaded.retrieve(queries, k=5).ids == bm25.retrieve(queries, k=5).ids
        assert loaded.corpus.checksum() == world.corpus.checksum()
    bm25.save(out)  # replacing an existing index works and leaves no temporary folders
    assert sorted(p.name for p in tmp_path.iterdir()) == ["idx"]


def test_load_errors(bm25, tmp_path):
    import json

    with pytest.raises(ValueError, match=r"is not a rag-gym index: params\.json is missing"):
        BM25Retriever.load(tmp_path)
    out = bm25.save(tmp_path / "idx")
    params = json.loads((out / "params.json").read_text())
    (out / "params.json").write_text(json.dumps({**params, "corpus_checksum": "0"}))
    with pytest.raises(ValueError, match=r"corpus\.jsonl does not match .*params\.json"):
        BM25Retriever.load(out)
    (out / "params.json").write_text(json.dumps({**params, "kind": "dense"}))
    with pytest.raises(ValueError, match="expected kind 'bm25', got 'dense'"):
        BM25Retriever.load(out)
    (out / "params.json").write_text("{")
    with pytest.raises(ValueError, match="is not valid JSON"):
        BM25Retriever.load(out)
    with pytest.raises(RuntimeError, match=r"call index\(corpus\) first"):
        BM25Retriever().save(tmp_path / "none")


@pytest.mark.parametrize(
    "victim", ["data.csc.index.npy", "indices.csc.index.npy", "vocab.index.json"]
)
def test_truncated_or_tampered_arrays_name_the_file(bm25, tmp_path, victim):
    out = bm25.save(tmp_path / "idx")
    path = out / "bm25s" / victim
    path.write_bytes(path.read_bytes()[: max(1, path.stat().st_size // 3)])
    with pytest.raises(ValueError, match=r"bm25s: cannot load the BM25 arrays .*rebuild the index"):
        loaded = BM25Retriever.load(out)
        loaded.retrieve(["x"], k=1)

"""BM25 through bm25s: same scores as the raw library, batching, exclusion, pools, ties; the numba
and numpy backends give identical results."""

from __future__ import annotations

import importlib.util
import random

import bm25s
import numpy as np
import pytest
import Stemmer

from rag_gym.data import Corpus, Passage
from rag_gym.data.synthhop import SynthHopConfig, generate
from rag_gym.retrieval import BM25Retriever
from rag_gym.retrieval.bm25 import BM25Config
from tests.conftest import first_fast
from tests.retrieval.index_tools import edit_params, reseal


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


def test_a_pool_naming_a_passage_twice_ranks_it_once(world, bm25):
    q = world.questions["validation"][0]
    pool = [p.id for p in q.passages]
    doubled = [pid for pid in pool for _ in range(2)]
    once = bm25.retrieve([q.question], k=len(pool), within=[pool]).ids[0]
    twice = bm25.retrieve([q.question], k=len(pool), within=[doubled]).ids[0]
    assert twice == once and len(set(twice)) == len(pool)
    with pytest.raises(ValueError, match=rf"expected k <= {len(pool)} \(the size of the candidate"):
        bm25.retrieve([q.question], k=len(pool) + 1, within=[doubled])


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
    assert {p.name for p in out.iterdir()} == {
        "bm25s",
        "corpus.jsonl",
        "corpus_map",
        "params.json",
        "serving",
    }
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
    with pytest.raises(ValueError, match=r"params\.json was edited or damaged"):
        BM25Retriever.load(out)
    edit_params(out, corpus_checksum="0")  # behind the params checksum: the corpus's own
    with pytest.raises(ValueError, match=r"corpus\.jsonl does not match .*params\.json"):
        BM25Retriever.load(out)
    edit_params(out, kind="dense")
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
    with pytest.raises(ValueError, match=rf"bm25s/{victim} has \d+ bytes, the index was built"):
        BM25Retriever.load(out)
    reseal(out)  # behind the checksums, bm25s's own reading still names the folder
    # (the numba backend maps serving/'s copy of the vocabulary and never reads the JSON one)
    backend = "numpy" if victim == "vocab.index.json" else "auto"
    with pytest.raises(ValueError, match=r"bm25s: cannot load the BM25 arrays .*rebuild the index"):
        loaded = BM25Retriever.load(out, backend=backend)
        loaded.retrieve(["x"], k=1)


@pytest.mark.parametrize(
    ("victim", "message"),
    [
        ("vocab_table.npy", r"vocab_table\.npy has 3 slots, not a power of two"),
        ("vocab_offsets.npy", r"vocab_offsets\.npy does not span vocab_bytes\.npy"),
    ],
)
def test_a_damaged_mapped_vocabulary_names_the_file(bm25, tmp_path, victim, message):
    out = bm25.save(tmp_path / "idx")
    np.save(out / "serving" / victim, np.zeros(3, dtype=np.load(out / "serving" / victim).dtype))
    reseal(out)
    with pytest.raises(ValueError, match=message):
        BM25Retriever.load(out)


def test_a_mapped_vocabulary_with_wrong_columns_never_reads_outside_its_arrays(bm25, tmp_path):
    # slots pointing past the vocabulary (and offsets past the bytes) read as unknown tokens
    out = bm25.save(tmp_path / "idx")
    query = "Which river flows through the capital?"
    sound = BM25Retriever.load(out)
    expected, blank = sound.retrieve([query], k=3), sound.retrieve(["the of"], k=3)
    assert expected.ids != blank.ids  # a query of stop words only: no token scores
    table = np.load(out / "serving" / "vocab_table.npy")
    table[table >= 0] = 10**9
    np.save(out / "serving" / "vocab_table.npy", table)
    reseal(out)
    damaged = BM25Retriever.load(out)
    assert damaged.retrieve([query], k=3).ids == blank.ids  # every token unknown now
    assert damaged.model.vocab_dict.token_ids(bm25.tokenize([query])[0]) == []


# ---- backends: numba (compiled, pruned) and numpy give identical results ----------------------
needs_numba = pytest.mark.skipif(
    importlib.util.find_spec("numba") is None, reason="needs numba: pip install 'rag-gym[fast]'"
)


def tie_heavy_corpus(seed: int, n: int = 1500) -> Corpus:
    # few words, many repeats: many passages share exact scores, so ties decide the ranking
    rng = random.Random(seed)
    common = ["apple", "pear", "plum", "red", "green", "tree", "city", "river", "guild", "north"]
    rare = [f"word{i}" for i in range(40)]
    return Corpus(
        [
            Passage(
                f"p{rng.randrange(10**6):06d}-{i}",
                "",
                " ".join(
                    rng.choices(common + rare, weights=[30] * 10 + [1] * 40, k=rng.randint(1, 12))
                ),
            )
            for i in range(n)
        ]
    )


@needs_numba
@pytest.mark.parametrize("method", first_fast(["lucene", "robertson", "atire", "bm25l", "bm25+"]))
def test_numba_backend_identical_to_numpy(method, monkeypatch):
    from rag_gym.retrieval import bm25 as bm25_module

    corpus = tie_heavy_corpus(seed=len(method))
    config = BM25Config(method=method)
    fast = BM25Retriever(corpus, config, backend="numba", n_threads=3)
    slow = BM25Retriever(corpus, config, backend="numpy")
    assert (fast.backend, slow.backend) == ("numba", "numpy")
    assert fast._prunable  # bm25s's eager scores are >= 0 in sorted posting lists
    rng = random.Random(7)
    words = ["apple", "pear", "plum", "red", "tree", "river", "word3", "word17", "unknown", "the"]
    queries = [" ".join(rng.choices(words, k=rng.randint(0, 8))) for _ in range(150)]
    for split in (10**12, 1):  # one thread, then the batch split across threads
        monkeypatch.setattr(bm25_module, "_POSTINGS_PER_THREAD", split)
        for k in (1, 3, 10, 100, len(corpus) - 1, len(corpus)):
            exclude = [rng.sample(corpus.ids, rng.randint(0, 30)) for _ in queries]
            for excl in (None, exclude):
                expected = slow.retrieve(queries, k, exclude=excl)
                got = fast.retrieve(queries, k, exclude=excl)
                assert got.ids == expected.ids, (method, k)
                assert got.scores == expected.scores, (method, k)  # bit-identical float32


@needs_numba
def test_numba_backend_pools_and_stamp_wrap(world):
    from rag_gym.retrieval import _bm25_numba

    fast = BM25Retriever(world.corpus, backend="numba")
    slow = BM25Retriever(world.corpus, backend="numpy")
    questions = world.questions["train"][:30]
    queries = [q.question for q in questions]
    pools = [[p.id for p in q.passages] if i % 2 else None for i, q in enumerate(questions)]
    exclude = [[p.id for p in q.passages[:2]] for q in questions]
    for kwargs in ({"within": pools}, {"within": pools, "exclude": exclude}):
        assert fast.retrieve(queries, 4, **kwargs) == slow.retrieve(queries, 4, **kwargs)
    assert np.array_equal(fast.scores(queries[0]), slow.scores(queries[0]))
    # the scratch stamps restart near their int32 limit without changing any result
    for scratch in fast._scratch:
        scratch[-1][0] = _bm25_numba.STAMP_LIMIT - 4
    assert fast.retrieve(queries, 5) == slow.retrieve(queries, 5)
    assert all(s[-1][0] < 100 for s in fast._scratch)


def test_backend_choice_and_errors(monkeypatch):
    from rag_gym.retrieval import bm25 as bm25_module

    corpus = Corpus([Passage("a", "", "red apple"), Passage("b", "", "pear")])
    with pytest.raises(
        ValueError, match=r"expected a BM25 backend in .*got 'numbaa'; did you mean 'numba'\?"
    ):
        BM25Retriever(corpus, backend="numbaa")
    with pytest.raises(ValueError, match=r"expected n_threads to be an int >= 1 or None, got 0"):
        BM25Retriever(corpus, n_threads=0)
    assert BM25Retriever(corpus, backend="numpy").backend == "numpy"
    monkeypatch.setattr(bm25_module, "_numba_kernels", lambda: None)  # numba not installed
    assert BM25Retriever(corpus).backend == "numpy"
    with pytest.raises(ImportError, match=r"pip install 'rag-gym\[fast\]'"):
        BM25Retriever(corpus, backend="numba")


def test_query_token_outside_the_index_is_an_error(world):
    bm25 = BM25Retriever(world.corpus)
    bm25.model.get_tokens_ids = lambda tokens: [10**9]  # only a damaged vocabulary does this
    with pytest.raises(ValueError, match="a query token maps outside the index's columns"):
        bm25.retrieve(["x"], k=1)


@pytest.mark.parametrize(
    ("victim", "message"),
    [
        ("indices.csc.index.npy", r"indices\.csc\.index\.npy holds passage numbers outside"),
        ("indptr.csc.index.npy", r"indptr\.csc\.index\.npy spans"),
    ],
)
def test_inconsistent_arrays_name_the_file(bm25, tmp_path, victim, message):
    # the right size and format, wrong values: caught by a verified load (and by a load with
    # the numpy backend, which reads every array), before any kernel reads them
    out = bm25.save(tmp_path / "idx")
    path = out / "bm25s" / victim
    array = np.load(path)
    array[-1] = array[-1] + 10**6
    np.save(path, array)
    with pytest.raises(ValueError, match=rf"{victim} does not match its checksum"):
        BM25Retriever.load(out)
    reseal(out)  # behind the checksums, the arrays' consistency check
    with pytest.raises(ValueError, match=message):
        BM25Retriever.load(out, verify=True)
    with pytest.raises(ValueError, match=message):
        BM25Retriever.load(out, backend="numpy")


def test_a_damaged_posting_list_is_caught_before_a_kernel_reads_it(bm25, tmp_path):
    # a plain load reads no posting: the first query that reads the damaged list stops with a
    # ValueError naming the files; other lists still answer
    out = bm25.save(tmp_path / "idx")
    path = out / "bm25s" / "indices.csc.index.npy"
    indices = np.load(path)
    indices[-1] = 10**6  # a passage number past the corpus, in the last token's list
    np.save(path, indices)
    reseal(out)
    loaded = BM25Retriever.load(out)
    vocab = loaded.model.vocab_dict
    last = len(loaded._indptr) - 2
    token = next(t for t in vocab if vocab[t] == last)
    assert loaded.tokenize([token]) == [[token]]  # the stem is its own token
    other = next(t for t in vocab if t and vocab[t] != last and loaded.tokenize([t]) == [[t]])
    assert loaded.retrieve([other], k=1).ids[0]
    with pytest.raises(ValueError, match=r"posting list of token column \d+ is damaged"):
        loaded.retrieve([f"{other} {token}"], k=1)
    with pytest.raises(ValueError, match=r"posting list of token column \d+ is damaged"):
        loaded.scores(token)
    with pytest.raises(ValueError, match=r"indices\.csc\.index\.npy holds passage numbers outside"):
        BM25Retriever.load(out, verify=True)  # a verified load reads every posting


@pytest.mark.parametrize(
    "config",
    [BM25Config(), BM25Config(stopwords=None, stemmer=None), BM25Config(stopwords="de")],
    ids=["en-stemmed", "plain", "german-stop-words"],
)
def test_query_tokens_equal_bm25s_tokenize(world, config):
    # rag-gym runs bm25s.tokenize's steps itself for queries; they must give the same tokens
    texts = world.corpus.contents()[:300] + [q.question for q in world.questions["train"]]
    texts += ["", "a", "The THE the", "naïve café Zürich's 42nd year—born 1962?", "x_y 3.5 _a"]
    texts += ["Stra\u00dfe und die Häuser", "e-mail: someone@example.org, tab\there\nnew line"]
    stemmer = Stemmer.Stemmer(config.stemmer) if config.stemmer else None
    expected = bm25s.tokenize(
        texts, stopwords=config.stopwords, stemmer=stemmer, return_ids=False, show_progress=False
    )
    assert BM25Retriever(config=config).tokenize(texts) == expected


def test_passage_lengths_are_saved_and_an_index_without_them_still_answers(bm25, tmp_path):
    """serving/doc_len.npy holds each passage's BM25 length (the block-max kernel's length
    bounds); an index saved before it existed loads without them and answers the same; lengths
    of the wrong shape are an error naming the file."""
    out = bm25.save(tmp_path / "idx")
    lengths = np.load(out / "serving" / "doc_len.npy")
    assert lengths.dtype == np.int32 and len(lengths) == len(bm25.corpus)
    assert np.array_equal(lengths, [len(t) for t in bm25.tokenize(bm25.corpus.contents())])
    queries = [p.text for p in list(bm25.corpus)[:30]] + ["the of", "zzz unknown"]
    expected = bm25.retrieve(queries, 3)
    loaded = BM25Retriever.load(out)
    assert loaded._doc_len is not None and loaded.retrieve(queries, 3) == expected
    (out / "serving" / "doc_len.npy").unlink()
    reseal(out)
    old = BM25Retriever.load(out)
    assert old._doc_len is None and old.retrieve(queries, 3) == expected
    np.save(out / "serving" / "doc_len.npy", lengths[:-1])
    reseal(out)
    with pytest.raises(ValueError, match=r"doc_len.npy must hold \d+ int32 lengths; rebuild"):
        BM25Retriever.load(out)

"""Block-max pruning returns exactly what exhaustive scoring returns: the same ids, the same
float32 scores bit for bit, the same tie-breaks, on random and adversarial queries."""

from __future__ import annotations

import importlib.util
import random

import numpy as np
import pytest

from rag_gym.data import Corpus, Passage
from rag_gym.retrieval import BM25Retriever
from rag_gym.retrieval.bm25 import BM25Config
from tests.conftest import first_fast

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("numba") is None, reason="needs numba: pip install 'rag-gym[fast]'"
)

COMMON = ["apple", "pear", "plum", "red", "green", "tree", "city", "river", "guild", "north"]
RARE = [f"word{i}" for i in range(300)]
STOP = ["the", "a", "of", "and", "is", "was", "in"]


def zipf_corpus(seed: int, n: int = 4000, duplicates: int = 200) -> Corpus:
    """Long posting lists (many blocks), a Zipf-like vocabulary, and ``duplicates`` copies of a
    few texts so that exact ties sit at every rank."""
    rng = random.Random(seed)
    words = COMMON + RARE
    weights = [40] * len(COMMON) + [1 / (1 + i) * 30 for i in range(len(RARE))]
    texts = [
        " ".join(rng.choices(words + STOP, weights + [20] * len(STOP), k=rng.randint(1, 30)))
        for _ in range(n - duplicates)
    ]
    texts += [rng.choice(texts[:20]) for _ in range(duplicates)]
    ids = [f"p{rng.randrange(10**7):07d}-{i}" for i in range(n)]
    rng.shuffle(ids)
    return Corpus([Passage(pid, "", text) for pid, text in zip(ids, texts, strict=True)])


def adversarial_queries(rng: random.Random, corpus: Corpus) -> list[str]:
    words = COMMON + RARE
    queries = [" ".join(rng.choices(words, k=rng.randint(1, 8))) for _ in range(120)]
    queries += [
        "the of and a",  # stop words only: every passage scores the same
        "",
        "zzzunknown qqqnothing",  # no token in the index
        " ".join(rng.choices(words + STOP, k=400)),  # one very long query
        "apple apple apple apple pear",  # repeated terms
        "word0 word0 word1 word1 word1",
        " ".join(["red"] * 30),
        "apple",  # one very long list
        "word299",  # one very short list
    ]
    queries += [corpus.texts[i] for i in rng.sample(range(len(corpus)), 20)]  # ties: whole texts
    return queries


def pruned_and_exhaustive(corpus: Corpus, config: BM25Config | None = None):
    """The numba backend on an index its block-max kernel prunes, and exhaustive scoring (the
    numpy backend: bm25s's full score array and a top-k over it) on the same corpus."""
    bm25 = BM25Retriever(corpus, config, backend="numba")
    assert bm25._prunable
    return bm25, BM25Retriever(corpus, config, backend="numpy")


@pytest.mark.parametrize("method", first_fast(["lucene", "robertson", "atire", "bm25l", "bm25+"]))
def test_pruned_equals_exhaustive(method):
    from rag_gym.retrieval import _bm25_numba

    corpus = zipf_corpus(seed=len(method))
    bm25, exhaustive = pruned_and_exhaustive(corpus, BM25Config(method=method))
    rng = random.Random(3)
    queries = adversarial_queries(rng, corpus)
    default_blocks = bm25._blocks
    small_blocks = _bm25_numba.compute_blocks(bm25._data, bm25._indices, bm25._indptr, block=4)
    for k in (1, 3, 257):
        exclude = [rng.sample(corpus.ids, rng.randint(0, 40)) for _ in queries]
        for excl in (None, exclude):
            expected = exhaustive.retrieve(queries, k, exclude=excl)
            assert all(len(ids) == k for ids in expected.ids) or excl is not None
            for blocks in (default_blocks, small_blocks):
                bm25._blocks = blocks
                got = bm25.retrieve(queries, k, exclude=excl)
                assert got.ids == expected.ids, (method, k, blocks["block"])
                # bit-identical float32
                assert got.scores == expected.scores, (method, k, blocks["block"])
    bm25._blocks = default_blocks


@pytest.mark.parametrize("id_order", ["passage order", "shuffled"])
def test_templated_ties_at_the_kth_score(id_order):
    """Thousands of passages tie at the k-th best score (one template, one length, as SynthHop's
    work passages do); the kernel skips such ranges only when its float32 bound and the blocks'
    id ranks prove nothing there can enter, so it returns exhaustive scoring's top-k, ties broken
    by id, whether id order follows passage order or not."""
    rng = random.Random(13)
    n = 3000
    nouns = ["lantern", "harbour", "mirror"]
    texts = [f"the {RARE[i % 300]}x{i} {nouns[i % 3]}" for i in range(n)]
    texts += [f"the {RARE[i]}y {nouns[i % 3]} of the north guild" for i in range(60)]  # longer
    ids = [f"w{i:05d}" for i in range(len(texts))]
    if id_order == "shuffled":
        rng.shuffle(ids)
    corpus = Corpus([Passage(pid, "", t) for pid, t in zip(ids, texts, strict=True)])
    bm25, exhaustive = pruned_and_exhaustive(corpus)
    queries = [f"{RARE[i % 300]}x{i} {nouns[i % 3]}" for i in rng.sample(range(n), 40)]
    queries += ["lantern", "harbour mirror", "lantern lantern guild", "north lantern"]
    for k in (1, 3, 50):
        exclude = [rng.sample(corpus.ids, 3) for _ in queries]
        for excl in (None, exclude):
            expected = exhaustive.retrieve(queries, k, exclude=excl)
            got = bm25.retrieve(queries, k, exclude=excl)
            assert got.ids == expected.ids, (id_order, k)
            assert got.scores == expected.scores, (id_order, k)
    # the ties are real: a two-word query's 2nd to k-th results share one score
    got = bm25.retrieve([queries[0]], 3)
    assert got.scores[0][1] == got.scores[0][2]


def test_pruned_equals_numpy_and_pools():
    corpus = zipf_corpus(seed=11)
    fast = BM25Retriever(corpus, backend="numba")
    slow = BM25Retriever(corpus, backend="numpy")
    rng = random.Random(5)
    queries = adversarial_queries(rng, corpus)
    pools = [rng.sample(corpus.ids, 50) if i % 3 == 0 else None for i in range(len(queries))]
    exclude = [rng.sample(corpus.ids, 5) for _ in queries]
    for kwargs in (
        {},
        {"exclude": exclude},
        {"within": pools},
        {"within": pools, "exclude": exclude},
    ):
        assert fast.retrieve(queries, 5, **kwargs) == slow.retrieve(queries, 5, **kwargs)


def test_stop_word_query_ranks_by_id():
    corpus = zipf_corpus(seed=2, n=800, duplicates=0)
    bm25 = BM25Retriever(corpus, backend="numba")
    got = bm25.retrieve(["the of and"], k=7, exclude=[[min(corpus.ids)]])
    assert got.ids == [sorted(corpus.ids)[1:8]]
    assert got.scores == [[0.0] * 7]


def test_pruning_reads_fewer_postings_than_exist():
    """The block facts bound every posting: each block's maximum is its largest contribution
    and its last passage the block's last, so a skipped block cannot hold a better passage."""
    from rag_gym.retrieval import _bm25_numba

    corpus = zipf_corpus(seed=4)
    bm25 = BM25Retriever(corpus, backend="numba")
    blocks = _bm25_numba.compute_blocks(bm25._data, bm25._indices, bm25._indptr, block=8)
    data, indices, indptr = bm25._data, bm25._indices, bm25._indptr
    for t in range(len(indptr) - 1):
        lo, hi = int(indptr[t]), int(indptr[t + 1])
        for n, b in enumerate(range(int(blocks["block_ptr"][t]), int(blocks["block_ptr"][t + 1]))):
            chunk = slice(lo + 8 * n, min(lo + 8 * (n + 1), hi))
            assert blocks["block_max"][b] == data[chunk].max()
            assert blocks["block_last"][b] == indices[chunk][-1]
        assert blocks["token_max"][t] == (data[lo:hi].max() if hi > lo else 0)
    assert np.all(np.diff(blocks["block_ptr"]) == -(-np.diff(indptr) // 8))


def test_an_index_the_kernel_cannot_prune_is_scored_whole():
    """An index with an unsorted posting list (which bm25s never writes) is not pruned: the
    numba backend scores every passage, with exhaustive scoring's results."""
    corpus = zipf_corpus(seed=6, n=300, duplicates=0)
    bm25, exhaustive = pruned_and_exhaustive(corpus)
    for word in ("apple", "pear"):
        token = bm25.model.get_tokens_ids(bm25.tokenize([word])[0])[0]
        span = slice(bm25._indptr[token], bm25._indptr[token + 1])
        for key in ("indices", "data"):  # the same postings, in reverse passage order
            bm25.model.scores[key][span] = bm25.model.scores[key][span][::-1].copy()
    bm25._install(bm25.model, corpus, doc_len=bm25._doc_len)
    assert not bm25._prunable
    rng = random.Random(6)
    queries = adversarial_queries(rng, corpus)
    exclude = [rng.sample(corpus.ids, 5) for _ in queries]
    for k in (1, 3, 40):
        for excl in (None, exclude):
            expected = exhaustive.retrieve(queries, k, exclude=excl)
            assert bm25.retrieve(queries, k, exclude=excl) == expected, k


KINDS = {
    "loom": "is a memoir published in {y} by {a} guild",
    "voyage": "is a novel published in {y} by {a} guild",
    "harbour": "is a city in {a} north and its capital river",
    "lantern": "is a guild headquartered in {a} city founded by {a}",
}


def templated_corpus(seed: int, n: int = 6000) -> Corpus:
    """SynthHop-like text: every passage of a kind holds its kind's template words, kinds are
    interleaved, each passage has its own name (one passage in ten a word longer), and a few
    passages repeat a word (tf 2), so the k-th best score is a tie among the shortest
    passages of a kind."""
    rng = random.Random(seed)
    texts = []
    for i in range(n):
        kind = rng.choice(list(KINDS))
        name = f"name{i}" if rng.random() < 0.9 else f"name{i} x{i}"
        body = KINDS[kind].format(y=rng.randint(1700, 1999), a=f"maker{rng.randrange(50)}")
        extra = f" {kind}" if rng.random() < 0.05 else ""
        texts.append(f"The {name} {kind} {body}{extra}.")
    ids = [f"t{i:05d}" for i in range(n)]
    if seed % 2:
        rng.shuffle(ids)
    return Corpus([Passage(pid, "", t) for pid, t in zip(ids, texts, strict=True)])


@pytest.mark.parametrize("seed", [0, 1])
def test_length_bounds_keep_exhaustive_top_k(seed):
    """The block-max kernel with its length and pair bounds (and without them, as for an index
    saved without passage lengths) returns exhaustive scoring's top-k on templated text whose
    k-th best score is a tie, with comparison-like and template-only queries, k of 1, 3 and 40,
    exclusions, and blocks of 64 and of 4 postings (whose superblocks of 256 postings the wide
    ranges then skip)."""
    from rag_gym.retrieval import _bm25_numba

    corpus = templated_corpus(seed)
    bm25, exhaustive = pruned_and_exhaustive(corpus)
    doc_len = bm25._doc_len
    default_blocks = bm25._blocks
    small_blocks = _bm25_numba.compute_blocks(bm25._data, bm25._indices, bm25._indptr, block=4)
    assert doc_len is not None
    rng = random.Random(seed)

    def named(i: int) -> str:  # passage i's name and kind
        words = corpus.texts[i].split()
        return " ".join(words[1:3] if words[3] in KINDS else words[1:4])

    queries = [
        f"which was published first, the {named(i)} or the {named(j)}"
        for i, j in (rng.sample(range(len(corpus)), 2) for _ in range(60))
    ]
    queries += [f"who founded the publisher of the {named(i)}" for i in range(8)]
    queries += ["published guild", "loom loom published", "city capital north river", "guild"]
    queries += [corpus.texts[i] for i in rng.sample(range(len(corpus)), 10)]
    for k in (1, 3, 40):
        exclude = [rng.sample(corpus.ids, 5) for _ in queries]
        for excl in (None, exclude):
            expected = exhaustive.retrieve(queries, k, exclude=excl)
            for blocks in (default_blocks, small_blocks):
                bm25._blocks = blocks
                for lengths in (doc_len, None):
                    bm25._doc_len = lengths
                    got = bm25.retrieve(queries, k, exclude=excl)
                    case = (seed, k, blocks["block"], lengths is not None)
                    assert got.ids == expected.ids, case
                    assert got.scores == expected.scores, case
    bm25._blocks = default_blocks
    bm25._doc_len = doc_len
    # the ties are real: most comparison queries' top 40 hold one score 20 times or more
    got = bm25.retrieve(queries[:60], 40)
    tied = [max(scores.count(s) for s in scores) for scores in got.scores]
    assert sum(n >= 20 for n in tied) >= 30, tied


def test_length_tables_bound_every_posting():
    """Each length table bounds its token's contribution on every passage at least that long,
    and each block's shortest passage is no longer than any passage in the block."""
    from rag_gym.retrieval import _bm25_numba

    corpus = templated_corpus(2)
    bm25 = BM25Retriever(corpus, backend="numba")
    data, indices, indptr = bm25._data, bm25._indices, bm25._indptr
    tokens = np.arange(len(indptr) - 1, dtype=np.int64)
    state: dict = {}
    minlen, rows, table = _bm25_numba.length_bounds(
        tokens, data, indices, indptr, bm25._blocks, bm25._doc_len, state
    )
    cap = table.shape[1] - 1
    lengths = np.minimum(bm25._doc_len, cap)
    blocks, block = bm25._blocks, int(bm25._blocks["block"])
    with_rows = 0
    for t in range(len(tokens)):
        lo, hi = int(indptr[t]), int(indptr[t + 1])
        ln = lengths[indices[lo:hi]]
        if rows[t] >= 0:
            with_rows += 1
            assert hi - lo >= _bm25_numba.LENGTH_TABLE_DF
            for length in np.unique(ln):
                # the bound at L covers every passage of length >= L, and is reached
                assert table[rows[t], length] == data[lo:hi][ln >= length].max()
        else:
            assert hi - lo < state["min_df"]
        for n, c in enumerate(range(int(blocks["block_ptr"][t]), int(blocks["block_ptr"][t + 1]))):
            assert minlen[c] == ln[n * block : (n + 1) * block].min()
    assert with_rows >= 10  # the template words have tables
    # a second call builds nothing new: the same rows, the same table
    again = _bm25_numba.length_bounds(tokens, data, indices, indptr, blocks, bm25._doc_len, state)
    assert np.array_equal(again[1], rows) and again[2] is state["table"]


def test_pair_bounds_and_superblocks_bound_every_passage():
    """Each pair bound is the largest contribution one token makes to a passage holding the
    other (0 for template words of two kinds, which never share a passage), and each
    superblock holds its blocks' largest contribution, last passage, smallest id rank and
    shortest passage."""
    from rag_gym.retrieval import _bm25_numba

    corpus = templated_corpus(3)
    bm25 = BM25Retriever(corpus, backend="numba")
    data, indices, indptr = bm25._data, bm25._indices, bm25._indptr
    blocks = _bm25_numba.compute_blocks(data, indices, indptr, block=4)
    blocks["block_rank"] = _bm25_numba.block_min_rank(indices, indptr, blocks, bm25._id_rank)
    tokens = np.arange(len(indptr) - 1, dtype=np.int64)
    state: dict = {}
    minlen, rows, _ = _bm25_numba.length_bounds(
        tokens, data, indices, indptr, blocks, bm25._doc_len, state
    )
    with_rows = tokens[rows >= 0]
    assert len(with_rows) >= 10  # the template words
    # one query of every token with a row: every pair of them is computed
    pair = _bm25_numba.pair_bounds(
        with_rows, np.array([0, len(with_rows)]), rows[with_rows], data, indices, indptr, state
    )
    lists = {
        int(t): (indices[indptr[t] : indptr[t + 1]], data[indptr[t] : indptr[t + 1]])
        for t in with_rows
    }
    zeros = 0
    for a in with_rows:
        for b in with_rows:
            if a == b:
                continue
            _, _, in_b = np.intersect1d(lists[a][0], lists[b][0], return_indices=True)
            expected = lists[b][1][in_b].max() if len(in_b) else 0.0
            assert pair[rows[a], rows[b]] == expected, (a, b)
            zeros += expected == 0
    assert zeros >= 4  # e.g. "loom" and "harbour" never meet
    supers = _bm25_numba.super_blocks(with_rows, rows[with_rows], blocks, state)
    sb_off, sb_max, sb_last, sb_rank, sb_minlen = supers
    per = _bm25_numba.SUPERBLOCK
    checked = 0
    for t in with_rows:
        lo, hi = int(blocks["block_ptr"][t]), int(blocks["block_ptr"][t + 1])
        off = sb_off[rows[t]]
        assert off >= 0
        for x, c0 in enumerate(range(lo, hi, per)):
            c = slice(c0, min(c0 + per, hi))
            assert sb_max[off + x] == blocks["block_max"][c].max()
            assert sb_last[off + x] == blocks["block_last"][c][-1]
            assert sb_rank[off + x] == blocks["block_rank"][c].min()
            assert sb_minlen[off + x] == minlen[c].min()
            checked += 1
    assert checked > len(with_rows)  # lists of several superblocks (blocks of 4 postings)

"""Reciprocal-rank fusion, the query cache, and the full-corpus ("fullwiki") mode of real datasets."""

from __future__ import annotations

import gymnasium as gym
import pytest

import rag_gym  # noqa: F401
from rag_gym.data import Corpus, Passage
from rag_gym.data.synthhop import SynthHopConfig, generate
from rag_gym.retrieval import BM25Retriever
from rag_gym.retrieval.bm25 import BM25Config
from rag_gym.retrieval.cache import CachedRetriever
from rag_gym.retrieval.hybrid import HybridRetriever
from tests.conftest import shared_file


@pytest.fixture(scope="module")
def world():
    return generate(SynthHopConfig(n_passages=2000, n_questions=(40, 10, 10)))


def test_rrf_by_hand():
    corpus = Corpus(
        [
            Passage(p, "", t)
            for p, t in [
                ("a", "red apple pie"),
                ("b", "green apple"),
                ("c", "red wine"),
                ("d", "pear"),
            ]
        ]
    )
    stemmed = BM25Retriever(corpus)
    plain = BM25Retriever(corpus, config=BM25Config(stemmer=None, stopwords=None))
    hybrid = HybridRetriever([stemmed, plain], k_rrf=60)
    r1 = stemmed.retrieve(["red apple"], k=4).ids[0]
    r2 = plain.retrieve(["red apple"], k=4).ids[0]
    expected = {d: 1 / (60 + r1.index(d) + 1) + 1 / (60 + r2.index(d) + 1) for d in "abcd"}
    result = hybrid.retrieve(["red apple"], k=4)
    assert result.ids[0] == sorted(expected, key=lambda d: (-expected[d], d))
    assert result.scores[0] == pytest.approx(sorted(expected.values(), reverse=True))


def test_hybrid_within_pool_and_errors(world):
    bm25 = BM25Retriever(world.corpus)
    hybrid = HybridRetriever([bm25, bm25])
    q = world.questions["validation"][0]
    pool = [p.id for p in q.passages]
    assert set(hybrid.retrieve([q.question], k=3, within=[pool]).ids[0]) <= set(pool)
    # fusing a retriever with itself keeps its ranking
    assert hybrid.retrieve([q.question], k=3).ids == bm25.retrieve([q.question], k=3).ids
    other = BM25Retriever(Corpus([Passage("x", "", "one thing")]))
    with pytest.raises(ValueError, match="expected every retriever to index the same corpus"):
        HybridRetriever([bm25, other])
    with pytest.raises(ValueError, match="expected at least one retriever"):
        HybridRetriever([])


def test_cache_returns_identical_results_and_counts(world):
    bm25 = BM25Retriever(world.corpus)
    cached = CachedRetriever(bm25, maxsize=3)
    queries = [q.question for q in world.questions["train"][:5]]
    batch = queries + queries[:2]
    assert cached.retrieve(batch, k=3).ids == bm25.retrieve(batch, k=3).ids
    assert (cached.hits, cached.misses) == (2, 5)
    assert cached.retrieve(queries[-1:], k=3).ids == bm25.retrieve(queries[-1:], k=3).ids
    assert cached.hits == 3  # still cached: the last three queries fit
    assert (
        cached.retrieve(queries[:1], k=3, exclude=[[bm25.retrieve(queries[:1], k=1).ids[0][0]]]).ids
        == bm25.retrieve(
            queries[:1], k=3, exclude=[[bm25.retrieve(queries[:1], k=1).ids[0][0]]]
        ).ids
    )


def test_env_with_a_cached_or_hybrid_retriever(world):
    for retriever in (
        CachedRetriever(BM25Retriever(world.corpus)),
        HybridRetriever([BM25Retriever(world.corpus)]),
    ):
        env = gym.make(
            "rag_gym/SynthHop-v0",
            split="validation",
            retriever=retriever,
            dataset_kwargs={"n_passages": 2000, "n_questions": [40, 10, 10]},
        )
        _, info = env.reset(seed=0)
        _, _, _, _, info = env.step({"type": 0, "text": info["question"]})
        assert len(info["retrieved_ids"]) == 3


@pytest.mark.shared_data
def test_fullwiki_mode_searches_the_pooled_split():
    path = str(shared_file("hotpotqa/hotpot_dev_distractor_300.json"))
    env = gym.make("rag_gym/HotpotQA-v0", data_path=path, corpus_mode="corpus")
    _, info = env.reset(seed=0)
    assert env.unwrapped.corpus_mode == "corpus" and len(env.unwrapped.corpus) > 2900
    pool = {p.id for p in env.unwrapped.current_example.passages}
    seen_outside = False
    for seed in range(10):
        _, info = env.reset(seed=seed)
        pool = {p.id for p in env.unwrapped.current_example.passages}
        _, _, _, _, info = env.step({"type": 0, "text": "American film director born"})
        seen_outside |= not set(info["retrieved_ids"]) <= pool
    assert seen_outside  # passages of other questions come back: the whole split is searched

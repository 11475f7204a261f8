"""Reciprocal-rank fusion over any retrievers (Cormack et al., 2009), e.g. BM25 + a dense model
(EVO-RAG's "RRF-BGE" retriever, §4.1 of Ji et al., "Curriculum-Guided Reinforcement Learning
for Efficient Multi-Hop Retrieval-Augmented Generation", arXiv:2505.17391).

``score(d) = Σ_r 1 / (k_rrf + rank_r(d))`` with ranks from 1 and ``k_rrf = 60``; each member
retrieves ``depth`` candidates per query (default ``max(k, 100)``), and the fused list is
sorted by score, ties by passage id. All members must index the same corpus.

>>> from rag_gym.data import Corpus, Passage
>>> from rag_gym.retrieval import BM25Retriever
>>> corpus = Corpus([Passage("a", "", "red apple"), Passage("b", "", "green apple"), Passage("c", "", "pear")])
>>> hybrid = HybridRetriever([BM25Retriever(corpus), BM25Retriever(corpus)])
>>> hybrid.retrieve(["red apple"], k=2).ids
[['a', 'b']]
"""

from __future__ import annotations

from collections.abc import Sequence

from rag_gym.data.types import Corpus
from rag_gym.retrieval.base import BaseRetriever, RetrievalResult, Retriever, check_k


class HybridRetriever(BaseRetriever):
    """Reciprocal-rank fusion of several retrievers over one corpus."""

    def __init__(
        self, retrievers: Sequence[Retriever], k_rrf: int = 60, depth: int | None = None
    ) -> None:
        if len(retrievers) < 1:
            raise ValueError("expected at least one retriever to fuse, got none")
        if k_rrf < 0:
            raise ValueError(f"expected k_rrf >= 0, got {k_rrf}")
        sizes = {len(r.corpus) for r in retrievers}
        if len(sizes) != 1:
            raise ValueError(
                f"expected every retriever to index the same corpus, got sizes {sorted(sizes)}"
            )
        self.retrievers = list(retrievers)
        self.k_rrf = k_rrf
        self.depth = depth
        self.corpus: Corpus = retrievers[0].corpus

    def index(self, corpus: Corpus) -> None:
        for r in self.retrievers:
            r.index(corpus)
        self.corpus = corpus

    def _retrieve(self, queries, k, exclude, pools) -> RetrievalResult:
        fused: list[dict[str, float]] = [{} for _ in queries]
        for r in self.retrievers:
            depths = [
                min(self.depth or max(k, 100), len(p) if p is not None else len(self.corpus))
                for p in pools
            ]
            depth = min(depths) if depths else k
            result = r.retrieve(queries, max(depth, min(k, depth)), exclude=exclude, within=pools)
            for scores, ids in zip(fused, result.ids, strict=True):
                for rank, pid in enumerate(ids, 1):
                    scores[pid] = scores.get(pid, 0.0) + 1.0 / (self.k_rrf + rank)
        out_ids, out_scores = [], []
        for scores, pool in zip(fused, pools, strict=True):
            if pool is not None:
                check_k(k, len(pool), "the candidate pool")
            ranked = sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))[:k]
            out_ids.append([pid for pid, _ in ranked])
            out_scores.append([s for _, s in ranked])
        return RetrievalResult(out_ids, out_scores)

    def __repr__(self) -> str:
        return f"HybridRetriever({self.retrievers!r}, k_rrf={self.k_rrf})"

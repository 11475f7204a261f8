"""An LRU cache over ``(query, k, exclude, within)`` for any retriever.

RL rollouts repeat sub-queries (the same question's first hop in every sample of a GRPO
group); ``CachedRetriever`` answers repeats from memory. It only caches what the retriever
returned, so results are identical with and without it.

>>> from rag_gym.data import Corpus, Passage
>>> from rag_gym.retrieval import BM25Retriever
>>> cached = CachedRetriever(BM25Retriever(Corpus([Passage("a", "", "red apple"), Passage("b", "", "pear")])))
>>> cached.retrieve(["apple", "apple"], k=1).ids, cached.hits, cached.misses
([['a'], ['a']], 1, 1)
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from rag_gym.retrieval.base import (
    Excludes,
    Pools,
    RetrievalResult,
    Retriever,
    check_queries,
    per_query,
)


class CachedRetriever:
    """Wrap ``retriever`` with an LRU cache of ``maxsize`` entries (one per query and options)."""

    def __init__(self, retriever: Retriever, maxsize: int = 65_536) -> None:
        if maxsize < 1:
            raise ValueError(f"expected maxsize >= 1, got {maxsize}")
        self.retriever = retriever
        self.maxsize = maxsize
        self._cache: OrderedDict[tuple, tuple[list[str], list[float]]] = OrderedDict()
        self.hits = 0
        self.misses = 0

    @property
    def corpus(self):
        return self.retriever.corpus

    def index(self, corpus) -> None:
        self.retriever.index(corpus)
        self._cache.clear()

    def retrieve(
        self, queries: Sequence[str], k: int, exclude: Excludes = None, within: Pools = None
    ) -> RetrievalResult:
        queries = check_queries(queries)
        excl = [tuple(sorted(e)) if e else () for e in per_query(exclude, len(queries), "exclude")]
        pools = [
            tuple(p) if p is not None else None for p in per_query(within, len(queries), "within")
        ]
        keys = [(q, k, e, p) for q, e, p in zip(queries, excl, pools, strict=True)]
        missing = [i for i, key in enumerate(keys) if key not in self._cache]
        # the first occurrence of each missing key is retrieved; repeats in the batch are hits
        todo = list(dict.fromkeys(keys[i] for i in missing))
        self.hits += len(keys) - len(todo)
        self.misses += len(todo)
        fresh = {}
        if todo:
            result = self.retriever.retrieve(
                [key[0] for key in todo],
                k,
                exclude=[list(key[2]) for key in todo] if exclude is not None else None,
                within=[list(key[3]) if key[3] is not None else None for key in todo]
                if within is not None
                else None,
            )
            fresh = dict(zip(todo, zip(result.ids, result.scores, strict=True), strict=True))
        out_ids, out_scores = [], []
        for key in keys:
            if key in fresh:
                ids, scores = fresh[key]
            else:
                ids, scores = self._cache[key]
                self._cache.move_to_end(key)
            out_ids.append(list(ids))
            out_scores.append(list(scores))
        for key, value in fresh.items():
            self._cache[key] = value
            if len(self._cache) > self.maxsize:
                self._cache.popitem(last=False)
        return RetrievalResult(out_ids, out_scores)

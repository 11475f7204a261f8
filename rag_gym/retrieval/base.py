"""The retriever protocol every retrieval backend implements, and the shared top-k selection.

A retriever indexes a :class:`~rag_gym.data.Corpus` and answers batches of queries::

    result = retriever.retrieve(["who founded x", "where is y"], k=3)
    result.ids[0], result.scores[0]          # ranked ids and scores of the first query

``exclude`` removes ids per query (already-seen passages); ``within`` restricts each query to a
candidate set (a question's own distractor pool). Ties in score are broken by passage id, so a
ranking never depends on corpus order or on the selection algorithm.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from rag_gym.data.mapped import MappedCorpus
from rag_gym.data.types import Corpus

Excludes = Sequence[Iterable[str] | None] | None
"""``retrieve``'s ``exclude``: per query, the ids never to return (None: none)."""

Pools = Sequence[Sequence[str] | None] | None
"""``retrieve``'s ``within``: per query, the only ids it may return (None: any)."""


@dataclass(frozen=True)
class RetrievalResult:
    """Ranked results of a batch of queries: ``ids[i]`` and ``scores[i]`` belong to query ``i``."""

    ids: list[list[str]]
    scores: list[list[float]]

    def __len__(self) -> int:
        return len(self.ids)


@runtime_checkable
class Retriever(Protocol):
    """What an environment needs from a retriever."""

    corpus: Corpus

    def index(self, corpus: Corpus) -> None: ...

    def retrieve(
        self, queries: Sequence[str], k: int, exclude: Excludes = None, within: Pools = None
    ) -> RetrievalResult: ...


class BaseRetriever:
    """The argument checks every retriever shares: :meth:`retrieve` checks the queries, ``k``
    and the per-query ``exclude`` and ``within`` lists once, then calls :meth:`_retrieve`, which
    a backend implements."""

    def searchable(self) -> int:
        """How many passages a query without a pool searches (``k`` is checked against it)."""
        return len(self.corpus)

    def retrieve(
        self, queries: Sequence[str], k: int, exclude: Excludes = None, within: Pools = None
    ) -> RetrievalResult:
        """Top-``k`` passage ids and scores for each query.

        Args:
            queries: query strings.
            k: results per query; ``ValueError`` when it exceeds the corpus (or a ``within`` pool).
            exclude: per query, ids never to return (fewer than ``k`` come back when the
                candidates run out).
            within: per query, the candidate ids to rank (a question's own pool); ``None``
                entries rank the whole corpus. Unknown ids are an error, never skipped.
        """
        queries = check_queries(queries)
        exclude = per_query(exclude, len(queries), "exclude")
        within = per_query(within, len(queries), "within")
        if not queries or any(pool is None for pool in within):
            check_k(k, self.searchable())
        return self._retrieve(queries, k, exclude, within)

    def _retrieve(
        self,
        queries: list[str],
        k: int,
        exclude: list[Iterable[str] | None],
        within: list[Sequence[str] | None],
    ) -> RetrievalResult:
        """The search of checked arguments: one ``exclude`` and one ``within`` entry a query
        (``None``: nothing excluded; the whole corpus)."""
        raise NotImplementedError


def corpus_size(retriever: Retriever) -> int:
    """How many passages ``retriever`` searches: ``len(retriever.corpus)``, or for a server's
    corpus (which holds only the passages received so far) the server's size, ``sys.maxsize``
    when the server does not say."""
    corpus = retriever.corpus
    if hasattr(corpus, "server_size"):
        size = corpus.server_size
        return sys.maxsize if size is None else int(size)
    return len(corpus)


def check_queries(queries: Sequence[str]) -> list[str]:
    if isinstance(queries, str):
        raise TypeError("expected a list of query strings, got a single str; wrap it: [query]")
    queries = list(queries)
    bad = [q for q in queries if not isinstance(q, str)]
    if bad:
        raise TypeError(
            f"expected every query to be a str, got {type(bad[0]).__name__}: {bad[0]!r}"
        )
    return queries


def check_k(k: int, n_candidates: int, what: str = "the corpus") -> int:
    if not isinstance(k, (int, np.integer)) or isinstance(k, bool):
        raise TypeError(f"expected k to be an int, got {type(k).__name__}")
    if k < 1:
        raise ValueError(f"expected k >= 1, got {k}")
    if k > n_candidates:
        raise ValueError(f"expected k <= {n_candidates} (the size of {what}), got k={k}; lower k")
    return int(k)


def per_query(arg: Sequence | None, n: int, name: str) -> list:
    if arg is None:
        return [None] * n
    arg = list(arg)
    if len(arg) != n:
        raise ValueError(f"expected {name} to have one entry per query ({n}), got {len(arg)}")
    return arg


class IdColumn:
    """The ids of a corpus, taken by arrays of positions: an object array for an in-memory
    :class:`Corpus` (one fancy index per batch), read on access for a
    :class:`~rag_gym.data.mapped.MappedCorpus` (no 21M-string array at load)."""

    __slots__ = ("_array", "_corpus")

    def __init__(self, corpus: Corpus) -> None:
        self._corpus = corpus
        self._array = (
            None if isinstance(corpus, MappedCorpus) else np.array(corpus.ids, dtype=object)
        )

    def take(self, pos: np.ndarray) -> list:
        """``ids[pos]`` as (nested) lists: a list for a 1-D ``pos``, a list of lists for 2-D."""
        if self._array is not None:
            return self._array[pos].tolist()
        pos = np.asarray(pos)
        flat = self._corpus.ids_at(pos.ravel())
        if pos.ndim == 1:
            return flat
        width = pos.shape[1]
        return [flat[r * width : (r + 1) * width] for r in range(pos.shape[0])]


def id_ranks(corpus: Corpus) -> np.ndarray:
    """Rank of each corpus position in passage-id order: the tie-breaker for :func:`top_k`.

    >>> from rag_gym.data import Passage
    >>> id_ranks(Corpus([Passage("b", "", "x"), Passage("a", "", "y")])).tolist()
    [1, 0]
    """
    if isinstance(corpus, MappedCorpus):
        return corpus.id_rank
    order = np.argsort(np.array(corpus.ids, dtype=object), kind="stable")
    ranks = np.empty(len(corpus), dtype=np.int64)
    ranks[order] = np.arange(len(corpus))
    return ranks


def positions(corpus: Corpus, ids: Iterable[str], strict: bool = True) -> np.ndarray:
    """Corpus positions of ``ids``, each once (a pool naming a passage twice ranks it once); an
    unknown id is a ``KeyError`` (``strict``) or skipped."""
    index = corpus._index
    ids = dict.fromkeys(ids)
    if strict:
        try:
            return np.fromiter((index[i] for i in ids), dtype=np.int64)
        except KeyError as exc:
            raise KeyError(f"id {exc.args[0]!r} is not in the corpus {corpus.name!r}") from None
    return np.fromiter((index[i] for i in ids if i in index), dtype=np.int64)


def top_k(scores: np.ndarray, k: int, id_rank: np.ndarray) -> np.ndarray:
    """Positions of the ``k`` best scores, best first, ties broken by ``id_rank`` (ascending).

    Runs in O(n) plus O(m log m) for the m candidates tied with the k-th score. Positions whose
    score is ``-inf`` (excluded) are never returned, so fewer than ``k`` may come back.

    >>> top_k(np.array([1.0, 3.0, 3.0, 2.0]), 2, np.array([0, 2, 1, 3]))
    array([2, 1])
    """
    n = scores.shape[0]
    if k >= n:
        cand = np.arange(n)
    else:
        # a sparse score array is mostly one floor value (0 for BM25, -inf where excluded);
        # selecting among the passages above it avoids a partition over a sea of ties
        floor = scores.min()
        if np.isneginf(floor):  # the lowest score that is not excluded
            floor = np.min(scores, where=~np.isneginf(scores), initial=np.inf)
        above = np.flatnonzero(scores > floor)
        if len(above) >= k:
            sub = scores[above]
            kth = np.partition(sub, len(sub) - k)[len(sub) - k]
            cand = above[sub >= kth]
        else:
            # every passage above the floor, and the floor's first ones by id
            at_floor = np.flatnonzero(scores == floor)
            need = k - len(above)
            if need < len(at_floor):
                at_floor = at_floor[np.argpartition(id_rank[at_floor], need - 1)[:need]]
            cand = np.concatenate([above, at_floor])
    order = np.lexsort((id_rank[cand], -scores[cand]))[:k]
    picked = cand[order]
    if np.isneginf(scores[picked]).any():
        picked = picked[~np.isneginf(scores[picked])]
    return picked

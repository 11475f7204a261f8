"""BM25 retrieval through `bm25s <https://github.com/xhluca/bm25s>`_ (sparse, eager scoring).

rag-gym does not re-implement BM25: it tokenises with ``bm25s.tokenize`` (English stop words,
Snowball English stemmer from PyStemmer), indexes with ``bm25s.BM25`` and scores with its
``get_scores_from_ids``. It adds what an environment needs on top: batched retrieval that
returns passage ids, per-query exclusion of ids, restriction to a candidate pool, and ties broken
by passage id.

>>> from rag_gym.data import Corpus, Passage
>>> corpus = Corpus([Passage("d1", "Ada", "Ada was born in Vell."),
...                  Passage("d2", "Vell", "Vell is a town in Orra."),
...                  Passage("d3", "Orra", "Orra is a country.")])
>>> bm25 = BM25Retriever(corpus)
>>> bm25.retrieve(["where was Ada born"], k=2).ids
[['d1', 'd2']]
>>> bm25.retrieve(["where was Ada born"], k=2, exclude=[["d1"]]).ids
[['d2', 'd3']]
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from rag_gym.data.types import Corpus
from rag_gym.retrieval.base import (
    RetrievalResult,
    check_k,
    check_queries,
    id_ranks,
    per_query,
    positions,
    top_k,
)
from rag_gym.retrieval.persist import read_index, write_index


@dataclass(frozen=True)
class BM25Config:
    """BM25 parameters (bm25s defaults: Lucene variant, k1 = 1.5, b = 0.75)."""

    k1: float = 1.5
    """Term-frequency saturation."""
    b: float = 0.75
    """Length normalisation."""
    method: str = "lucene"
    """bm25s variant: ``lucene``, ``robertson``, ``atire``, ``bm25l`` or ``bm25+``."""
    stopwords: str | None = "en"
    """Stop-word list passed to ``bm25s.tokenize`` (``None`` keeps every token)."""
    stemmer: str | None = "english"
    """Snowball stemmer language (PyStemmer), ``None`` for no stemming."""

    def __post_init__(self) -> None:
        if self.method not in ("lucene", "robertson", "atire", "bm25l", "bm25+"):
            raise ValueError(
                f"expected method in lucene/robertson/atire/bm25l/bm25+, got {self.method!r}"
            )
        if self.k1 < 0 or not 0 <= self.b <= 1:
            raise ValueError(f"expected k1 >= 0 and 0 <= b <= 1, got k1={self.k1}, b={self.b}")


class BM25Retriever:
    """BM25 over a :class:`Corpus` (title and text are indexed together)."""

    def __init__(
        self,
        corpus: Corpus | None = None,
        config: BM25Config | None = None,
        show_progress: bool = False,
    ) -> None:
        import bm25s

        self._bm25s = bm25s
        self.config = config or BM25Config()
        self.show_progress = show_progress
        self._stemmer = None
        if self.config.stemmer:
            import Stemmer

            self._stemmer = Stemmer.Stemmer(self.config.stemmer)
        self.corpus = Corpus(name="empty")
        self.model: bm25s.BM25 | None = None
        if corpus is not None:
            self.index(corpus)

    def tokenize(self, texts: list[str]) -> list[list[str]]:
        """Tokens exactly as the index saw them (lower-case, stop words out, stemmed)."""
        return self._bm25s.tokenize(
            texts,
            stopwords=self.config.stopwords,
            stemmer=self._stemmer,
            return_ids=False,
            show_progress=False,
        )

    def index(self, corpus: Corpus) -> None:
        """(Re)build the index over ``corpus``."""
        if not isinstance(corpus, Corpus):
            raise TypeError(f"expected a rag_gym.data.Corpus, got {type(corpus).__name__}")
        if len(corpus) == 0:
            raise ValueError(f"expected a non-empty corpus, got {corpus!r}")
        bm25s = self._bm25s
        tokens = bm25s.tokenize(
            corpus.contents(),
            stopwords=self.config.stopwords,
            stemmer=self._stemmer,
            show_progress=self.show_progress,
        )
        if not any(tokens.vocab.keys() - {""}):
            raise ValueError(
                f"corpus {corpus.name!r} has no indexable words (every passage is empty, stop words "
                "or one-letter tokens); check the corpus text"
            )
        model = bm25s.BM25(k1=self.config.k1, b=self.config.b, method=self.config.method)
        model.index(tokens, show_progress=self.show_progress)
        self._install(model, corpus)

    def _install(self, model, corpus: Corpus) -> None:
        self.model = model
        self.corpus = corpus
        # rank of each position by passage id: the tie-breaker
        self._id_rank = id_ranks(corpus)
        self._ids = np.array(corpus.ids, dtype=object)

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every passage for one query (aligned with ``corpus.ids``)."""
        return self._scores_from_tokens(self.tokenize([query])[0])

    def _scores_from_tokens(self, tokens: list[str]) -> np.ndarray:
        assert self.model is not None
        ids = self.model.get_tokens_ids(tokens)
        if not ids:
            return np.zeros(len(self.corpus), dtype=np.float32)
        return self.model.get_scores_from_ids(ids)

    def retrieve(
        self,
        queries: Sequence[str],
        k: int,
        exclude: Sequence[Iterable[str] | None] | None = None,
        within: Sequence[Sequence[str] | None] | None = None,
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
        if self.model is None:
            raise RuntimeError("the retriever has no index yet; call index(corpus) first")
        queries = check_queries(queries)
        excl = per_query(exclude, len(queries), "exclude")
        pools = per_query(within, len(queries), "within")
        if within is None:
            check_k(k, len(self.corpus))
        tokens = self.tokenize(queries) if queries else []
        out_ids: list[list[str]] = []
        out_scores: list[list[float]] = []
        for toks, ex, pool in zip(tokens, excl, pools, strict=True):
            scores = self._scores_from_tokens(toks)
            if pool is not None:
                pos = positions(self.corpus, pool)
                check_k(k, len(pos), "the candidate pool")
                sub = scores[pos].astype(np.float64)
                if ex:
                    sub[np.isin(pos, positions(self.corpus, ex, strict=False))] = -np.inf
                picked = pos[top_k(sub, k, self._id_rank[pos])]
            else:
                if ex:
                    scores = scores.astype(np.float64)
                    scores[positions(self.corpus, ex, strict=False)] = -np.inf
                picked = top_k(scores, k, self._id_rank)
            out_ids.append(self._ids[picked].tolist())
            out_scores.append(scores[picked].astype(float).tolist())
        return RetrievalResult(out_ids, out_scores)

    # ---- persistence --------------------------------------------------------------------------
    def save(self, out_dir: str | Path) -> Path:
        """Write the index to ``out_dir``: ``params.json``, ``corpus.jsonl`` and bm25s's arrays
        (numpy and JSON, no pickle), atomically (:mod:`rag_gym.retrieval.persist`)."""
        if self.model is None:
            raise RuntimeError("the retriever has no index yet; call index(corpus) first")
        model = self.model
        return write_index(
            out_dir,
            "bm25",
            self.corpus,
            {"config": asdict(self.config)},
            lambda tmp: model.save(str(tmp / "bm25s"), show_progress=False),
        )

    @classmethod
    def load(cls, in_dir: str | Path, mmap: bool = True) -> BM25Retriever:
        """Load an index written by :meth:`save`; ``mmap=True`` maps the arrays read-only, so
        processes that load the same directory share its memory through the page cache.

        A directory that is not a rag-gym BM25 index, whose corpus does not match its params, or
        whose arrays are damaged raises ``ValueError`` naming the file.
        """
        d = Path(in_dir)
        params, corpus = read_index(d, "bm25")
        retriever = cls(config=BM25Config(**params["config"]))
        try:
            model = retriever._bm25s.BM25.load(str(d / "bm25s"), mmap=mmap)
        except (OSError, ValueError, KeyError) as exc:
            raise ValueError(
                f"{d / 'bm25s'}: cannot load the BM25 arrays ({exc}); rebuild the index"
            ) from None
        if model.scores["num_docs"] != len(corpus):
            raise ValueError(
                f"{d / 'bm25s'} indexes {model.scores['num_docs']} documents, the corpus has {len(corpus)}"
            )
        retriever._install(model, corpus)
        return retriever

    def __repr__(self) -> str:
        return f"BM25Retriever(corpus={self.corpus!r}, config={self.config})"

"""BM25's index format: what the builder, the kernels and the retriever share.

:mod:`~rag_gym.retrieval.bm25_build` writes an index in this format,
:mod:`~rag_gym.retrieval._bm25_numba`'s kernels read its arrays, and
:class:`~rag_gym.retrieval.bm25.BM25Retriever` loads and serves it:

* the parameters: :class:`BM25Config` (``params.json``'s ``config``);
* the tokenisation, as ``bm25s.tokenize`` does it: lower case, :data:`TOKEN_PATTERN`,
  :func:`bm25s_stopwords`, then the config's Snowball stemmer;
* the posting blocks of the pruned kernels: :data:`BLOCK` postings each, token ``t``'s numbered
  ``block_ptr[t]:block_ptr[t + 1]`` (:func:`block_pointers`);
* the serving folder (:data:`SERVING`): what a loaded index maps instead of recomputing
  (:data:`SERVING_ARRAYS`).

It imports nothing of rag-gym's, so that each of the three imports it and none imports another
for these.

>>> block_pointers([0, 3, 3, 70], block=64).tolist()
[0, 1, 1, 3]
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np


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


TOKEN_PATTERN = r"(?u)\b\w\w+\b"
"""bm25s's token pattern (applied to the lower-cased text): words of two characters or more."""


def bm25s_stopwords(stopwords: str | None):
    """bm25s's stop-word list for ``stopwords`` (what its ``tokenize`` removes)."""
    from bm25s.tokenization import _infer_stopwords

    return _infer_stopwords(stopwords)


def tokenizer_steps(config: BM25Config) -> tuple:
    """``bm25s.tokenize``'s steps for ``config``: the token finder (applied to lower-cased
    text), the stop words (a frozenset), and the PyStemmer stemmer (``None``: no stemming)."""
    stemmer = None
    if config.stemmer:
        import Stemmer

        stemmer = Stemmer.Stemmer(config.stemmer)
    return re.compile(TOKEN_PATTERN).findall, frozenset(bm25s_stopwords(config.stopwords)), stemmer


BLOCK = 64
"""Postings per block of :func:`~rag_gym.retrieval._bm25_numba.block_facts`: each block keeps its
largest contribution and its last passage, so whole blocks whose bound cannot reach the k-th best
score are skipped."""


def block_pointers(indptr, block: int) -> np.ndarray:
    """Where each token's blocks start: token ``t`` has ``ceil(len / block)`` blocks, numbered
    ``block_ptr[t]:block_ptr[t + 1]``."""
    lengths = np.diff(np.asarray(indptr, dtype=np.int64))
    out = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum((lengths + block - 1) // block, out=out[1:])
    return out


SERVING = "serving"
"""The folder of an index that holds what serving needs beside bm25s's arrays."""

BLOCK_ARRAYS = ("token_max", "block_ptr", "block_max", "block_last")
"""The posting blocks (``serving/<name>.npy``): each token's largest contribution, where its
blocks start (:func:`block_pointers`), and each block's largest contribution and last passage."""

SERVING_ARRAYS = ("id_rank", "by_rank", *BLOCK_ARRAYS)
"""The arrays of every ``serving/`` folder (``<name>.npy``): each passage's rank by id (the
tie-break), the passage at each rank, and :data:`BLOCK_ARRAYS`. An index saved since they existed
also holds ``block_rank.npy`` (each block's smallest id rank) and ``doc_len.npy`` (each passage's
BM25 length, int32), and, where numba wrote it, the vocabulary as mapped arrays
(:mod:`rag_gym.retrieval._vocab_numba`)."""

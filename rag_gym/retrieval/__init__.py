"""Retrieval: one protocol (:class:`Retriever`) and its backends.

BM25 (:class:`BM25Retriever`, through bm25s), dense (:class:`rag_gym.retrieval.dense.DenseRetriever`,
sentence-transformers + FAISS; imported on use), reciprocal-rank fusion (:class:`HybridRetriever`)
and an LRU query cache (:class:`CachedRetriever`) all answer ``retrieve(queries, k, exclude,
within)`` the same way. :func:`load_index` loads a saved index directory of any kind
(``rag-gym index build``, ``Retriever.save``).
"""

from rag_gym.retrieval.base import RetrievalResult, Retriever
from rag_gym.retrieval.bm25 import BM25Retriever
from rag_gym.retrieval.cache import CachedRetriever
from rag_gym.retrieval.hybrid import HybridRetriever
from rag_gym.retrieval.load import load_index

__all__ = [
    "BM25Retriever",
    "CachedRetriever",
    "HybridRetriever",
    "RetrievalResult",
    "Retriever",
    "load_index",
]

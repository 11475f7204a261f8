"""Retrieval: one protocol (:class:`Retriever`) and its backends (BM25 here)."""

from rag_gym.retrieval.base import RetrievalResult, Retriever
from rag_gym.retrieval.bm25 import BM25Retriever

__all__ = ["BM25Retriever", "RetrievalResult", "Retriever"]

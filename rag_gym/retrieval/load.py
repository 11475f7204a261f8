"""Loading a saved index folder of any kind: :func:`load_index`.

``params.json`` names the kind (:mod:`rag_gym.retrieval.persist` reads and checks it), and the
kind's loader (:mod:`rag_gym.retrieval.kinds`) loads the folder: :meth:`BM25Retriever.load
<rag_gym.retrieval.bm25.BM25Retriever.load>` or :meth:`DenseRetriever.load
<rag_gym.retrieval.dense.DenseRetriever.load>` (FAISS and sentence-transformers are imported
only for a dense index).
"""

from __future__ import annotations

from pathlib import Path

from rag_gym.retrieval.kinds import RETRIEVER_KINDS
from rag_gym.retrieval.persist import read_params


def load_index(path: str | Path, verify: bool = False):
    """``(retriever, kind)`` for a saved index folder of any kind (``params.json`` says which;
    :mod:`~rag_gym.retrieval.kinds` loads it), every corruption a ``ValueError`` naming the
    file."""
    kind = read_params(path)["kind"]
    return RETRIEVER_KINDS.get(kind).load(path, verify=verify), kind

"""Index kinds: what loads a saved index folder, by the ``kind`` its ``params.json`` names.

``bm25`` (:class:`~rag_gym.retrieval.bm25.BM25Retriever`) and ``dense``
(:class:`~rag_gym.retrieval.dense.DenseRetriever`) are rag-gym's own. A retriever of the user's
own saves its folder with :func:`~rag_gym.retrieval.persist.write_index` under a kind name of its
own and registers that kind with :func:`register_retriever_kind` (or an installed package's entry
point in the group ``rag_gym.retrievers``); then ``index=FOLDER`` in any env, ``rag-gym evaluate
--index`` and ``rag-gym serve --index`` load it like the built-in kinds.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rag_gym._registry import Registry, caller_origin


@dataclass(frozen=True)
class RetrieverKind:
    """An index kind."""

    load: Callable[..., Any]
    """``load(path, verify=False) -> retriever`` for a folder written with this kind (its files
    checked against the manifest, every file read whole with ``verify``;
    :func:`~rag_gym.retrieval.persist.read_index` does both)."""
    description: str = ""


def _as_kind(name: str, value: Any) -> RetrieverKind:
    if isinstance(value, RetrieverKind):
        return value
    load = getattr(value, "load", None) if isinstance(value, type) else value
    if callable(load):
        return RetrieverKind(load=load)
    raise TypeError(
        "expected a RetrieverKind, a retriever class with a load(path, verify=False) "
        f"classmethod, or that function, got {value!r}"
    )


RETRIEVER_KINDS: Registry[RetrieverKind] = Registry(
    "retriever kind", "rag_gym.retrievers", _as_kind
)
"""Every index kind by name (a :class:`~rag_gym._registry.Registry`)."""


def register_retriever_kind(
    name: str, kind: RetrieverKind | type | Callable[..., Any], *, replace: bool = False
) -> RetrieverKind:
    """Register an index kind as ``name``: a :class:`RetrieverKind`, or the retriever class
    whose ``load(path, verify=False)`` reads a folder saved with that kind."""
    return RETRIEVER_KINDS.register(name, kind, replace=replace, origin=caller_origin())


def _lazy(module: str, cls: str) -> Callable[..., Any]:
    def load(path: Any, verify: bool = False) -> Any:
        return getattr(importlib.import_module(module), cls).load(path, verify=verify)

    return load


for _name, _cls, _description in (
    ("bm25", "BM25Retriever", "BM25"),
    ("dense", "DenseRetriever", "dense (FAISS)"),
):
    _kind = RetrieverKind(_lazy(f"rag_gym.retrieval.{_name}", _cls), _description)
    RETRIEVER_KINDS.register(_name, _kind, origin="rag-gym")


def kinds_text() -> str:
    """The kinds for a message: ``'bm25' or 'dense'``."""
    names = [repr(n) for n in RETRIEVER_KINDS.names()]
    return " or ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)

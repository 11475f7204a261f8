"""Where passages are searched: one type (:class:`Source`) for every way rag-gym is told, which
tells a server URL, a search-engine index URL, an index folder and a corpus file apart (with
the URL predicates of :mod:`rag_gym._http`).

=============  ===============================================  ==========================
kind           given as                                         searched by
=============  ===============================================  ==========================
``server``     ``retriever="http://127.0.0.1:8000"``             :class:`HttpRetriever`
``engine``     ``index="opensearch+http://127.0.0.1:9200/w"``   :class:`SearchEngineRetriever`
``index``      ``index="indexes/wiki"`` (a folder)              :func:`load_index`
``corpus``     ``corpus="corpus.jsonl"``                        BM25 over the file
=============  ===============================================  ==========================

>>> Source.parse("http://127.0.0.1:8000", "retriever")
Source(kind='server', location='http://127.0.0.1:8000')
>>> Source.parse("opensearch+http://127.0.0.1:9200/wiki18", "index").kind
'engine'
>>> Source.parse("indexes/bm25", "index").kind
'index'
>>> Source.parse("indexes/bm25", "retriever")
Traceback (most recent call last):
...
ValueError: expected retriever to be a retriever object or a server URL, got 'indexes/bm25'
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from rag_gym._http import is_engine_url, is_server_url, is_url

#: what each argument takes
ROLES = ("retriever", "index", "corpus")


@dataclass(frozen=True)
class Source:
    """Where passages are searched (see the module table)."""

    kind: str
    """``server``, ``engine``, ``index`` or ``corpus``."""
    location: str
    """The URL, folder or file."""

    @classmethod
    def parse(cls, value: str | os.PathLike | Source, role: str) -> Source:
        """``value`` given as the argument ``role`` (``retriever``, ``index`` or ``corpus``);
        a ``ValueError`` names what the argument takes."""
        if isinstance(value, Source):
            return value
        if role not in ROLES:
            raise ValueError(f"expected a role in {ROLES}, got {role!r}")
        if not isinstance(value, (str, os.PathLike)):
            raise TypeError(
                f"expected {role} to be a str or a path, got {type(value).__name__}: {value!r}"
            )
        text = os.fspath(value)
        if role == "retriever":
            if is_engine_url(text):
                raise ValueError(
                    f"an OpenSearch or Elasticsearch index is an index: pass index={text!r}"
                )
            if not is_server_url(text):
                raise ValueError(
                    f"expected retriever to be a retriever object or a server URL, got {text!r}"
                )
            return cls("server", text)
        if role == "index" and is_engine_url(text):
            return cls("engine", text)
        if is_url(text):
            raise ValueError(
                f"expected {role} to be a {'folder' if role == 'index' else 'file'} here, got "
                f"the URL {text!r}"
                + ("; a retrieval server's URL is retriever=" if is_server_url(text) else "")
            )
        return cls(role, text)

    @property
    def is_remote(self) -> bool:
        """Whether it is searched over the network (a server or a search engine)."""
        return self.kind in ("server", "engine")

    def open(self) -> Any:
        """The retriever that searches it."""
        if self.kind == "server":
            from rag_gym.retrieval.http import HttpRetriever

            return HttpRetriever(self.location)
        if self.kind == "engine":
            from rag_gym.retrieval.search_engine import SearchEngineRetriever

            return SearchEngineRetriever(self.location)
        if self.kind == "index":
            from rag_gym.retrieval.load import load_index

            return load_index(self.location)[0]
        from rag_gym.data import Corpus
        from rag_gym.retrieval.bm25 import BM25Retriever

        return BM25Retriever(Corpus.from_jsonl(self.location))

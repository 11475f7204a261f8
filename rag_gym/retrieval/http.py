"""``HttpRetriever``: the retriever protocol over any server that speaks Search-R1's ``/retrieve``.

``rag-gym serve`` is one such server; Search-R1's own ``retrieval_server.py`` (dense or Pyserini
BM25), FlashRAG-style servers and others are too. The client asks nothing of a server beyond
``POST /retrieve`` with ``{"queries": [...], "topk": k, "return_scores": true}`` and reads
``{"result": [[{"document": {...}, "score": s}, ...], ...]}``:

* ``GET /health`` is optional: when it answers with ``corpus_size`` and ``kind`` (rag-gym's
  shape) the server is known to honour ``exclude`` and ``within``; otherwise (a 404, as from
  Search-R1's server) the corpus size is unknown unless given as ``corpus_size=``;
* a document without an ``id`` (Pyserini's ``{"title", "text", "contents"}``) gets one derived
  from its contents (``"sha1:"`` and 16 hex digits), the same on every call;
* ``exclude`` and ``within`` are checked on the client side: a server not known to honour them
  is asked for ``k`` plus the excluded count, and every reply is filtered; if a filter leaves
  fewer than ``k``, the query is asked again for up to ``max_overfetch`` passages, and a pool
  that still cannot be filled raises ``ValueError`` (pool mode needs a server that honours
  ``within``, such as ``rag-gym serve``);
* replies are always requested with scores (a server that breaks on ``return_scores: false``
  is never asked for that), and bare documents are accepted too (their score is NaN);
* a reply that cannot be right is refused with a ``ValueError`` naming the server: a passage
  twice in one query's list, a score that is not a finite number, or fewer passages than asked
  while the corpus (or the pool) holds enough;
* a passage received again with other text (the server restarted on another index) replaces
  the text held; ``GET /health``'s ``index_id`` (``rag-gym serve``) tells such a restart apart
  (:meth:`HttpRetriever.index_changed`).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Sequence
from typing import Any

from rag_gym._http import SameOriginCredentials, is_server_url
from rag_gym.data.types import Corpus, Passage
from rag_gym.retrieval.base import BaseRetriever, RetrievalResult, check_k, check_queries

try:  # orjson (the server extra installs it) encodes and parses a reply of 768 passages
    import orjson  # about 5 times as fast as json: most of a batched request's cost at 100k

    def dumps(obj: Any) -> bytes:
        """JSON bytes of ``obj`` (UTF-8, compact)."""
        return orjson.dumps(obj)

    loads = orjson.loads
except ImportError:  # pragma: no cover - the server extra installs orjson

    def dumps(obj: Any) -> bytes:
        """JSON bytes of ``obj`` (UTF-8, compact)."""
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()

    loads = json.loads


class _NotFound(Exception):
    """A 404 or 405 (the path does not exist on this server)."""


#: follows redirects, the bearer token only to the same origin
_opener = urllib.request.build_opener(SameOriginCredentials)


def clean_token(token: str | None, source: str = "the token") -> str | None:
    """A bearer token as given (``--token``, ``$RAG_GYM_TOKEN``), ready to compare: ``None``
    for none (``None`` or ``""``); whitespace around it (a pasted space, the newline of a file
    read into the variable) is stripped with a warning, since it can never arrive in an
    ``Authorization`` header; a token of whitespace alone, or holding whitespace, control or
    non-ASCII characters inside, is a ``ValueError``.

    >>> clean_token("s3cret"), clean_token(""), clean_token(None)
    ('s3cret', None, None)
    """
    if token is None or token == "":
        return None
    if not isinstance(token, str):
        raise TypeError(f"expected {source} to be a str, got {type(token).__name__}")
    stripped = token.strip()
    if not stripped:
        raise ValueError(
            f"expected {source} to be a token, got only whitespace ({token!r}); give a token, "
            "or an empty one for none"
        )
    if stripped != token:
        warnings.warn(
            f"{source} has whitespace around it ({token!r}); using {stripped!r} (a header cannot "
            "carry it)",
            UserWarning,
            stacklevel=3,
        )
    if not (stripped.isascii() and stripped.isprintable()) or any(c.isspace() for c in stripped):
        raise ValueError(
            f"expected {source} to hold visible ASCII characters only (no spaces), got "
            f"{stripped!r}: an Authorization header cannot carry the others"
        )
    return stripped


def derived_id(contents: str) -> str:
    """The id given to a document that comes without one: a hash of its contents.

    >>> derived_id("Ada\\nAda was born in Vell.")
    'sha1:82ff0885a13acca8'
    """
    return "sha1:" + hashlib.sha1(contents.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def split_contents(contents: str) -> tuple[str, str]:
    """``(title, text)`` of a ``"title\\ntext"`` contents string, read as
    :meth:`rag_gym.data.Corpus.from_jsonl` reads it (quotes around the title dropped)."""
    title, sep, text = contents.partition("\n")
    if not sep:
        return "", contents
    return title.strip('"'), text


def parse_document(item: Any) -> tuple[str, str, float]:
    """``(id, contents, score)`` of one entry of a ``/retrieve`` reply, in any shape a
    Search-R1-style server sends: ``{"document": {...}, "score": s}`` or the document alone;
    the document as ``{"id", "contents"}``, ``{"title", "text", "contents"}`` (Pyserini, no id)
    or ``{"id", "title", "text"}``."""
    score = float("nan")
    doc = item
    if isinstance(item, dict) and isinstance(item.get("document"), dict):
        doc = item["document"]
        if item.get("score") is not None:
            raw = item["score"]
            try:
                score = float(raw) if not isinstance(raw, bool) else math.nan
            except (TypeError, ValueError):
                score = math.nan
            if not math.isfinite(score):
                raise ValueError(f"expected each score to be a finite number, got {raw!r}")
    if not isinstance(doc, dict):
        raise ValueError(
            f"expected each retrieved document to be a JSON object, got {str(doc)[:120]!r}"
        )
    contents = doc.get("contents")
    if not isinstance(contents, str):
        title, text = doc.get("title") or "", doc.get("text")
        if not isinstance(text, str):
            raise ValueError(
                f"expected a document with 'contents' or 'text', got keys {sorted(doc)[:8]}"
            )
        contents = f"{title}\n{text}" if title else text
    pid = doc.get("id", doc.get("docid", doc.get("_id")))
    return (str(pid) if pid is not None else derived_id(contents)), contents, score


class HttpRetriever(BaseRetriever):
    """The retriever protocol over HTTP: ``HttpRetriever("http://127.0.0.1:8000")``.

    Works against ``rag-gym serve`` and any server that answers Search-R1's ``/retrieve`` (see
    the module doc for what is checked and derived). Each call is one ``POST /retrieve``
    (timeout, retries with backoff on connection errors and 5xx); a 4xx raises ``ValueError``
    with the server's message. The token defaults to ``$RAG_GYM_TOKEN`` (empty: none).
    ``corpus`` holds the passages received so far, which is what an env renders, and ``len``
    counts them; ``corpus_size`` is the server's corpus size, or ``corpus_size=`` when the server
    does not say, or else ``None`` (unknown; :func:`~rag_gym.retrieval.base.corpus_size` then
    reports ``sys.maxsize``, never a reason to lower ``k``).

    Args:
        url: the server, with or without the ``/retrieve`` path.
        max_overfetch: most passages asked for one query when a server does not honour
            ``exclude`` or ``within`` and the client filters.
    """

    def __init__(
        self,
        url: str,
        token: str | None = None,
        timeout: float = 30.0,
        retries: int = 3,
        corpus_size: int | None = None,
        max_overfetch: int = 1000,
    ) -> None:
        if not is_server_url(url):
            raise ValueError(f"expected a server URL such as http://127.0.0.1:8000, got {url!r}")
        if max_overfetch < 1:
            raise ValueError(f"expected max_overfetch >= 1, got {max_overfetch}")
        if corpus_size is not None and (
            not isinstance(corpus_size, int) or isinstance(corpus_size, bool) or corpus_size < 0
        ):
            raise ValueError(
                f"expected corpus_size= to be a passage count (an int >= 0) or None, got "
                f"{corpus_size!r}"
            )
        url = url.rstrip("/")
        self.url = url[: -len("/retrieve")] if url.endswith("/retrieve") else url
        self.token = (
            clean_token(token, "token=")
            if token is not None
            else clean_token(os.environ.get("RAG_GYM_TOKEN"), "$RAG_GYM_TOKEN")
        )
        self.timeout = timeout
        self.retries = retries
        self.max_overfetch = max_overfetch
        self._corpus: Corpus | None = None
        try:
            health = self._request("GET", "/health")
        except _NotFound:
            health = None
        known = isinstance(health, dict) and "corpus_size" in health and "kind" in health
        #: whether the server is known to apply ``exclude`` and ``within`` itself
        self.honours_filters = known
        size = corpus_size
        if size is None and isinstance(health, dict) and health.get("corpus_size") is not None:
            size = health["corpus_size"]
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise ValueError(
                    f"{self.url}/health: expected corpus_size to be a passage count (an int >= "
                    f"0), got {str(size)[:80]}; is this a retrieval server (rag-gym serve)?"
                )
        #: the server's corpus size, ``None`` when neither the server nor the caller said
        self.corpus_size = size
        #: the server's ``index_id`` (``rag-gym serve``), ``None`` when it gives none
        self.index_id = self._index_id(health)

    @staticmethod
    def _index_id(health: Any) -> str | None:
        found = health.get("index_id") if isinstance(health, dict) else None
        return str(found) if found is not None else None

    def index_changed(self) -> bool:
        """Whether the server now serves another index than when this client was made (its
        ``/health`` ``index_id`` differs, or it cannot be reached); ``False`` for a server
        that gives no ``index_id`` (nothing to compare)."""
        if self.index_id is None:
            return False
        try:
            health = self._request("GET", "/health")
        except (OSError, ValueError, _NotFound):
            return True
        return self._index_id(health) != self.index_id

    def _request(self, method: str, path: str, body: dict | None = None) -> Any:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        data = dumps(body) if body is not None else None
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(min(0.2 * 2 ** (attempt - 1), 5.0))
            req = urllib.request.Request(self.url + path, data=data, headers=headers, method=method)
            try:
                with _opener.open(req, timeout=self.timeout) as resp:
                    raw = resp.read()
                try:
                    return loads(raw)
                except ValueError:
                    raise ValueError(
                        f"{self.url}{path} answered with something that is not JSON: {raw[:200]!r}"
                    ) from None
            except urllib.error.HTTPError as exc:
                detail = exc.read().decode(errors="replace")[:300]
                if exc.code in (404, 405):
                    raise _NotFound(f"{self.url}{path} answered {exc.code}") from None
                if exc.code < 500:
                    raise ValueError(f"{self.url}{path} answered {exc.code}: {detail}") from None
                last = ConnectionError(f"{self.url}{path} answered {exc.code}: {detail}")
            except TimeoutError:
                last = TimeoutError(f"{self.url}{path} did not answer within {self.timeout}s")
            except urllib.error.URLError as exc:
                last = ConnectionError(
                    f"cannot reach {self.url}{path}: {exc.reason}; is rag-gym serve running?"
                )
        assert last is not None
        raise last

    @property
    def corpus(self) -> Corpus:
        """The passages this client has received so far (``len`` counts them; the server's
        size is ``corpus_size``)."""
        if self._corpus is None:
            self._corpus = _RemoteCorpus(self.corpus_size, name=self.url)
        return self._corpus

    def index(self, corpus: Corpus) -> None:
        raise NotImplementedError(
            "build the index on the server side: rag-gym index build, then rag-gym serve"
        )

    def _search(
        self, queries: list[str], topk: int, extra: dict | None = None
    ) -> list[list[tuple[str, str, float]]]:
        body: dict[str, Any] = {"queries": queries, "topk": int(topk), "return_scores": True}
        body.update(extra or {})
        try:
            reply = self._request("POST", "/retrieve", body)
        except _NotFound as exc:
            raise ValueError(f"{exc}: expected a server with POST /retrieve") from None
        result = reply.get("result") if isinstance(reply, dict) else None
        if not isinstance(result, list) or len(result) != len(queries):
            raise ValueError(
                f"{self.url}/retrieve: expected {{'result': [one list per query]}} for "
                f"{len(queries)} queries, got {str(reply)[:200]}"
            )
        rows = []
        for i, docs in enumerate(result):
            if not isinstance(docs, list):
                raise ValueError(
                    f"{self.url}/retrieve: expected a list of documents for query {i}, got "
                    f"{str(docs)[:120]}"
                )
            try:
                row = [parse_document(item) for item in docs]
            except ValueError as exc:
                raise ValueError(f"{self.url}/retrieve, query {i}: {exc}") from None
            seen: set[str] = set()
            for pid, _, _ in row:
                if pid in seen:
                    raise ValueError(
                        f"{self.url}/retrieve returned passage {pid!r} twice for query {i}: a "
                        "ranking holds each passage once; the server or its index is faulty"
                    )
                seen.add(pid)
            rows.append(row)
        return rows

    def searchable(self) -> int:
        return self.corpus_size if self.corpus_size is not None else sys.maxsize

    def _retrieve(self, queries, k, exclude, within) -> RetrievalResult:
        check_k(k, self.searchable())  # with pools too: the server's topk
        excl = [set(e or ()) for e in exclude]
        pools = [list(dict.fromkeys(w)) if w is not None else None for w in within]
        if not queries:
            return RetrievalResult([], [])
        extra: dict[str, Any] = {}
        topk = k
        if self.honours_filters:
            if any(e is not None for e in exclude):
                extra["exclude"] = [sorted(e) for e in excl]
            if any(w is not None for w in within):
                extra["within"] = pools
        else:  # ask for enough that k remain once the excluded ids are dropped
            topk = min(k + max(len(e) for e in excl), max(self.max_overfetch, k))
        rows = self._search(queries, topk, extra)
        ids, scores = [], []
        corpus = self.corpus
        for i, docs in enumerate(rows):
            self._check_enough(docs, topk, excl[i], pools[i])
            kept = self._filtered(docs, excl[i], pools[i])
            fetched = topk
            while len(kept) < k and len(kept) < len(docs) and fetched < self.max_overfetch:
                # the server returned passages the filters drop: ask this query for more
                fetched = min(fetched * 2, self.max_overfetch)
                docs = self._search([queries[i]], fetched)[0]
                kept = self._filtered(docs, excl[i], pools[i])
            pool = pools[i]
            short = pool is not None and len(kept) < min(k, len(set(pool) - excl[i]))
            if short and len(kept) < len(docs):
                raise ValueError(
                    f"{self.url} does not honour within= (it returned passages outside the "
                    f"pool, and {len(kept)} of the pool's passages were among its top "
                    f"{fetched}); pool mode needs a server that applies within, such as "
                    "rag-gym serve"
                )
            kept = kept[:k]
            for pid, contents, _ in kept:
                title, text = split_contents(contents)
                if pid not in corpus:
                    corpus.add(Passage(pid, title, text))
                else:  # the server's text wins (it may have restarted on another index)
                    row = corpus.position(pid)
                    if corpus.titles[row] != title or corpus.texts[row] != text:
                        corpus.titles[row], corpus.texts[row] = title, text
            ids.append([d[0] for d in kept])
            scores.append([d[2] for d in kept])
        return RetrievalResult(ids, scores)

    def _check_enough(self, docs, topk: int, banned: set[str], pool: list[str] | None) -> None:
        """``ValueError`` when the server returned fewer than ``topk`` passages although its
        corpus (less what it was asked to exclude) or the pool it was asked to search within
        holds that many."""
        need = topk
        if self.corpus_size is not None:
            need = min(need, self.corpus_size - (len(banned) if self.honours_filters else 0))
        if pool is not None and self.honours_filters:
            need = min(need, len(set(pool) - banned))
        if len(docs) < need:
            raise ValueError(
                f"{self.url}/retrieve returned {len(docs)} passages for a query, where {topk} "
                f"were asked and at least {need} were due; the server or its index is faulty"
            )

    @staticmethod
    def _filtered(docs, banned: set[str], pool: list[str] | None) -> list:
        allowed = set(pool) if pool is not None else None
        return [d for d in docs if d[0] not in banned and (allowed is None or d[0] in allowed)]

    def passages(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        """The retrieved passages themselves (title and text from ``contents``)."""
        queries = check_queries(queries)
        if not queries:
            return []
        return [
            [Passage(pid, *split_contents(contents)) for pid, contents, _ in docs]
            for docs in self._search(queries, k)
        ]


class _RemoteCorpus(Corpus):
    """The passages a server has returned so far: ``len`` counts them; ``server_size`` is the
    server's corpus size (``None`` when unknown), what :func:`~rag_gym.retrieval.base.corpus_size`
    reports."""

    __slots__ = ("server_size",)

    def __init__(self, server_size: int | None, name: str) -> None:
        super().__init__(name=name)
        self.server_size = server_size

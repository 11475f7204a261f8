"""A batched retrieval server (FastAPI + uvicorn) that clients written for Search-R1 use unchanged.

``POST /retrieve`` takes and answers Search-R1's JSON shape::

    {"queries": ["..."], "topk": 3, "return_scores": true}
    -> {"result": [[{"document": {"id": "...", "contents": "title\\ntext"}, "score": 1.2}, ...], ...]}

(with ``return_scores`` false each query's list holds the documents alone), and what the
field's other clients send:

* ``{"queries": []}`` (a turn in which no rollout searches) answers ``{"result": []}``;
* one query, ``{"query": "...", "topk": k}`` (SkyRL-gym, rLLM; ``top_k`` is taken for
  ``topk``), answers ``result`` as for a one-query batch and also ``results``, a flat list of
  ``{"id", "content", "score"}`` (what rLLM's tool reads);
* ``topk`` null or 0 means the default (3); numeric strings (``"3"``, ``"true"``) are read as
  pydantic's lax mode reads them, which is what Search-R1's own server accepts; unknown fields
  are ignored and logged once per set of names;
* ``contents`` is the corpus row's own text when the server is given the corpus file
  (``rag-gym serve --corpus``; wiki-18 quotes its titles), else ``title\\ntext``.

rag-gym clients may add ``exclude`` and ``within`` (per query id lists), which the in-process
retrievers take. ``GET /health`` (and its alias ``/healthz``) answers ``{"status": "ok",
"corpus_size": N, "kind": ..., "server": "rag-gym", "version": ..., "index_id": ...}``
(``index_id`` changes when the server is started on another index).

Concurrent requests are retrieved together (micro-batching): every request queued while earlier
batches are being retrieved joins the next batch (up to ``max_batch`` queries and
``max_batch_cost`` queries x ``topk``; a request larger than that is retrieved in slices), and up
to ``max_in_flight`` batches run at once in worker threads, so batches grow with the load and a
busy server never waits on a timer; an idle one waits up to ``batch_window_ms`` for company.
Work for a client that has gone (closed its connection after sending a request) is dropped before
each batch and each slice, and its reply is never built.

Limits (:class:`ServerLimits`): queries per request (4,096), characters per query, ``topk``, the
body size, a deadline for a request head and one for its body (a client that stalls is answered
408 and dropped), the keep-alive time, the open connections, and how long a reply may wait for
its client to read it: a reply of more than 2,048 passages is sent a part at a time as the client
reads it, and a client that reads nothing for ``send_timeout`` seconds is dropped, so a client
that never reads holds little of the server's memory. A request the server cannot
serve gets a 4xx with a message; a fault of the server itself (a damaged index that raises, or a
score that is not a number) gets a 500 that names the fault's type (its details, which may
hold server-side paths, go to the server's log), never a ``null`` score. The server binds
127.0.0.1 by default; with a token (``--token`` or ``RAG_GYM_TOKEN``; empty means none) every
request needs ``Authorization: Bearer <token>`` (the scheme in any case).

Needs ``pip install 'rag-gym[server]'``.
"""

import asyncio
import contextlib
import gc
import hmac
import itertools
import logging
import math
import secrets
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rag_gym.data.types import Corpus
from rag_gym.retrieval._uvicorn_compat import disconnect_probe, drop_connection
from rag_gym.retrieval.base import Retriever, corpus_size
from rag_gym.retrieval.http import HttpRetriever, clean_token, dumps, loads
from rag_gym.retrieval.load import load_index  # re-exported: it lives in retrieval.load

__all__ = [
    "HttpRetriever",
    "ServerLimits",
    "VerbatimContents",
    "create_app",
    "dumps",
    "load_index",
    "loads",
    "make_server",
    "run_server",
]

logger = logging.getLogger("rag_gym.retrieval.server")
_NEEDS = "the retrieval server needs fastapi and uvicorn: pip install 'rag-gym[server]'"


@dataclass(frozen=True)
class ServerLimits:
    """What one request may ask, and how long and how many clients may take."""

    max_queries: int = 4096
    """Queries per request (Search-R1's GRPO script sends 512 prompts x 5 = 2,560)."""
    max_query_chars: int = 4096
    """Characters per query."""
    max_topk: int = 100
    """Largest ``topk``."""
    default_topk: int = 3
    """``topk`` when a request gives none (or null, or 0, as Search-R1's server reads it)."""
    max_body_bytes: int = 8 * 1024 * 1024
    """Request body size (refused before it is read when ``Content-Length`` says so)."""
    body_timeout: float = 30.0
    """Seconds a request's body may take to arrive once its head has (then 408)."""
    head_timeout: float = 10.0
    """Seconds a request head may take to arrive, counted from the connection or the previous
    response (then the connection is closed)."""
    max_head_bytes: int = 64 * 1024
    """Bytes of a request head (then 431)."""
    send_timeout: float = 30.0
    """Seconds a reply may wait for its client to read the next part of it; a client that reads
    nothing for that long is disconnected and what the server held for it is freed."""
    keep_alive: int = 5
    """Seconds an idle keep-alive connection is kept (uvicorn's ``timeout_keep_alive``)."""
    max_connections: int = 1024
    """Open connections and requests in progress; beyond it uvicorn answers 503
    (``limit_concurrency``)."""

    def __post_init__(self) -> None:
        for name in ("max_queries", "max_query_chars", "max_topk", "default_topk"):
            if getattr(self, name) < 1:
                raise ValueError(f"expected {name} >= 1, got {getattr(self, name)}")
        if self.default_topk > self.max_topk:
            raise ValueError(
                f"expected default_topk <= max_topk ({self.max_topk}), got {self.default_topk}"
            )
        for name in ("max_body_bytes", "max_head_bytes", "keep_alive", "max_connections"):
            if getattr(self, name) < 1:
                raise ValueError(f"expected {name} >= 1, got {getattr(self, name)}")
        for name in ("body_timeout", "head_timeout", "send_timeout"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"expected {name} > 0 seconds, got {value!r}")


class VerbatimContents:
    """Each corpus row's ``contents`` exactly as the corpus file holds it.

    :meth:`rag_gym.data.Corpus.from_jsonl` drops the quotes around a title (wiki-18 writes
    ``"\\"Title\\"\\ntext"``), so ``title\\ntext`` is not what Search-R1's server sends and what
    its policies were trained on. This keeps, per row, the number of quotes dropped on each side
    (two bytes) and, for any row that the rule does not rebuild exactly, the row itself.
    """

    def __init__(self, corpus: Corpus, quotes: np.ndarray, rows: dict[int, str]) -> None:
        self.corpus = corpus
        self.quotes = quotes
        self.rows = rows

    @classmethod
    def from_jsonl(cls, path: str | Path, corpus: Corpus) -> "VerbatimContents":
        """Read ``path`` (the ``{id, contents}`` file ``corpus`` was built from), checking that
        its ids are the corpus's, row by row."""
        from rag_gym.data._io import iter_jsonl

        path = Path(path)
        quotes = np.zeros((len(corpus), 2), dtype=np.uint8)
        rows: dict[int, str] = {}
        titles, texts, ids = corpus.titles, corpus.texts, corpus.ids
        i = -1
        for i, (lineno, record) in enumerate(iter_jsonl(path)):
            if i >= len(ids) or str(record.get("id")) != ids[i]:
                expected = repr(ids[i]) if i < len(ids) else "no row (the index is shorter)"
                raise ValueError(
                    f"{path} line {lineno}: id {record.get('id')!r}, where the index has "
                    f"{expected}; give --corpus the file the index was built from"
                )
            contents = record.get("contents")
            if not isinstance(contents, str):
                continue  # {id, title, text} rows: title\ntext is all there is
            title, sep, _ = contents.partition("\n")
            lead = len(title) - len(title.lstrip('"'))
            trail = len(title.lstrip('"')) - len(title.strip('"'))
            if sep and (lead or trail) and lead < 256 and trail < 256:
                quotes[i] = (lead, trail)
            if cls._build(titles[i], texts[i], quotes[i]) != contents:
                rows[i] = contents
        if i + 1 != len(ids):
            raise ValueError(
                f"{path} has {i + 1} rows, the index {len(ids)}; give --corpus the file the "
                "index was built from"
            )
        return cls(corpus, quotes, rows)

    @staticmethod
    def _build(title: str, text: str, quotes) -> str:
        lead, trail = int(quotes[0]), int(quotes[1])
        if lead or trail:
            return '"' * lead + title + '"' * trail + "\n" + text
        return f"{title}\n{text}" if title else text

    def __getitem__(self, row: int) -> str:
        found = self.rows.get(row)
        if found is not None:
            return found
        return self._build(self.corpus.titles[row], self.corpus.texts[row], self.quotes[row])


def create_app(
    retriever: Retriever,
    token: str | None = None,
    limits: ServerLimits | None = None,
    batch_window_ms: float = 0.0,
    max_batch: int = 512,
    kind: str = "bm25",
    max_in_flight: int = 2,
    contents: VerbatimContents | None = None,
    max_batch_cost: int = 16_384,
    index_id: str | None = None,
    watch=None,
):
    """The FastAPI app serving ``retriever`` (see the module doc).

    Args:
        token: the bearer token every request needs; ``None`` or ``""``: none; whitespace
            around it is stripped with a warning (:func:`~rag_gym.retrieval.http.clean_token`).
        batch_window_ms: how long an idle server waits for more requests to join a batch; a
            busy one (a batch in flight) dispatches at once what has queued meanwhile.
        max_batch: most queries per batch.
        max_batch_cost: most queries x ``topk`` per batch and per retrieval call (the passages
            it ranks and sends); a request over it is retrieved in slices.
        index_id: what ``GET /health`` reports as ``index_id``, so that clients notice a server
            restarted on another index at the same URL: the index's own checksum when it has
            one (``rag-gym serve --index`` gives its ``params.json``'s), else a random one per
            app (then any restart reads as another index).
        max_in_flight: batches retrieved at the same time, each in its own worker thread.
        contents: each row's verbatim ``contents`` (:class:`VerbatimContents`); default
            ``title\\ntext``.
        watch: the served folder's files as loaded
            (:class:`~rag_gym.retrieval.persist.IndexWatch`), checked before each batch and
            each part of a reply: once one was changed in place, every request and ``/health``
            is answered 503 and the server's log names the file.
    """
    try:
        from fastapi import FastAPI
        from pydantic import BaseModel, ConfigDict, StrictStr
    except ImportError as exc:
        raise ImportError(_NEEDS) from exc
    if max_in_flight < 1 or max_batch < 1 or max_batch_cost < 1 or batch_window_ms < 0:
        raise ValueError(
            f"expected max_in_flight >= 1, max_batch >= 1, max_batch_cost >= 1 and "
            f"batch_window_ms >= 0, got {max_in_flight}, {max_batch}, {max_batch_cost} and "
            f"{batch_window_ms}"
        )
    if contents is not None and contents.corpus is not retriever.corpus:
        raise ValueError("expected contents= read for this retriever's corpus")

    limits = limits or ServerLimits()
    token = clean_token(token, "the server's token")

    class RetrieveRequest(BaseModel):
        # lax, as Search-R1's QueryRequest: "3" is a topk, "true" a return_scores
        model_config = ConfigDict(extra="allow")
        queries: list[StrictStr] | None = None
        query: StrictStr | None = None
        topk: int | None = None
        top_k: int | None = None
        return_scores: bool = False
        exclude: list[list[StrictStr]] | None = None
        within: list[list[StrictStr] | None] | None = None

    from rag_gym import __version__

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        # the index and the corpus live as long as the server: exempt them from the cyclic
        # garbage collector, whose full passes would otherwise walk millions of their objects
        gc.collect()
        gc.freeze()
        try:
            yield
        finally:
            endpoint.stop()

    app = FastAPI(title="rag-gym retrieval server", lifespan=lifespan)
    batcher = _MicroBatcher(
        retriever, batch_window_ms / 1000.0, max_batch, max_in_flight, max_batch_cost
    )
    endpoint = _RetrieveEndpoint(retriever, RetrieveRequest, limits, batcher, contents, watch)
    # POST /retrieve goes straight to its endpoint (middleware order: the last added is outermost)
    app.add_middleware(_Route, path="/retrieve", method="POST", endpoint=endpoint)
    app.add_middleware(_Guard, token=token, max_body_bytes=limits.max_body_bytes)
    app.state.batcher = batcher
    status = {
        "status": "ok",
        "corpus_size": corpus_size(retriever),  # a cluster's index: its document count
        "kind": kind,
        "server": "rag-gym",
        "version": __version__,
        "index_id": index_id or secrets.token_hex(8),
    }

    @app.get("/health")
    @app.get("/healthz")
    async def health():
        stale = endpoint.stale()
        if stale is None:
            return status
        from fastapi.responses import JSONResponse

        return JSONResponse({**status, "status": "index changed", **stale}, status_code=503)

    return app


def run_server(
    app, host: str = "127.0.0.1", port: int = 8000, limits: ServerLimits | None = None,
    http: str = "auto",
) -> None:  # fmt: skip
    """Serve ``app`` with uvicorn under ``limits`` until the process is stopped (see
    :func:`make_server`). A fatal signal (a ``SIGBUS`` from an index file truncated under its
    memory map) writes the Python traceback of every thread to stderr before the process
    dies (:mod:`faulthandler`)."""
    import faulthandler

    faulthandler.enable()
    make_server(app, host, port, limits, http).run()


def make_server(
    app, host: str = "127.0.0.1", port: int = 8000, limits: ServerLimits | None = None,
    http: str = "auto",
):  # fmt: skip
    """The ``uvicorn.Server`` that :func:`run_server` runs: ``app`` under ``limits`` (keep-alive
    time, open connections as ``limit_concurrency``, the h11 head size, and a deadline and size
    cap on every request head, :mod:`rag_gym.retrieval._uvicorn_compat`), so stalled clients
    cannot hold the server's connections. Its ``run()`` serves until ``should_exit`` is set."""
    try:
        import uvicorn
    except ImportError as exc:
        raise ImportError(_NEEDS) from exc
    from rag_gym.retrieval._uvicorn_compat import base_protocol, guarded_protocol

    limits = limits or ServerLimits()
    # stalled connections are evicted at max_open; uvicorn's 503 comes a little later, so a
    # good request that arrives as a stalled one is evicted is not refused
    max_open = min(limits.max_connections, _descriptors_for_connections() - 16)
    protocol = guarded_protocol(
        base_protocol(http), limits.head_timeout, limits.max_head_bytes, max_open
    )
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        http=protocol,
        timeout_keep_alive=limits.keep_alive,
        limit_concurrency=max_open + 16,
        h11_max_incomplete_event_size=limits.max_head_bytes,
    )
    return uvicorn.Server(config)


def _descriptors_for_connections() -> int:
    """File descriptors this process may still give to connections: its soft limit, less what
    it holds now and a margin of 32 for what serving opens (threads, logs, the index)."""
    import os

    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):  # pragma: no cover - not a POSIX system
        return sys.maxsize
    if soft == resource.RLIM_INFINITY:
        return sys.maxsize
    try:
        held = len(os.listdir("/proc/self/fd"))
    except OSError:  # pragma: no cover - no procfs
        held = 64
    return max(soft - held - 32, 24)


class _RetrieveEndpoint:
    """``POST /retrieve`` as a plain ASGI app: the body is read under a deadline, validated by
    pydantic straight from the JSON bytes, and the reply is encoded once, so the request path
    costs little next to the retrieval it serves (FastAPI's dependency machinery and generic
    encoder cost more than a batched BM25 query does)."""

    def __init__(
        self, retriever: Retriever, model, limits: ServerLimits, batcher, contents, watch=None
    ) -> None:
        self.retriever = retriever
        self.corpus = retriever.corpus
        self.model = model
        self.limits = limits
        self.batcher = batcher
        self.contents = contents
        self.watch = watch
        self._stale: dict | None = None
        # a remote index (OpenSearch, Elasticsearch) holds passages this process has not seen:
        # its retriever checks the pools itself, and its size is the index's
        self.remote = hasattr(self.corpus, "server_size")
        self.unknown_logged: set[tuple[str, ...]] = set()

    async def __call__(self, scope, receive, send) -> None:
        task = asyncio.current_task()
        expired = False

        def expire() -> None:
            nonlocal expired
            expired = True
            task.cancel()

        # one timer for the whole body (cheaper than a wait_for per message)
        timer = asyncio.get_running_loop().call_later(self.limits.body_timeout, expire)
        body = bytearray()
        try:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return
                body += message.get("body", b"")
                if len(body) > self.limits.max_body_bytes:
                    await _send_json(
                        send, 413, {"error": f"body over {self.limits.max_body_bytes} bytes"}
                    )
                    return
                if not message.get("more_body"):
                    break
        except asyncio.CancelledError:
            if not expired:
                raise
            if hasattr(task, "uncancel"):
                task.uncancel()
            await _send_json(
                send,
                408,
                {"error": f"the request body did not arrive within {self.limits.body_timeout}s"},
                close=True,
            )
            return
        finally:
            timer.cancel()
        gone = disconnect_probe(receive)
        try:
            status, reply = await self.answer(bytes(body), gone)
        except _ClientGone:  # nobody to answer: its work was dropped
            # the socket said so before the server read the connection's end: wait for that,
            # so that the server does not take the silence for a fault of the app
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(receive(), self.limits.body_timeout)
            return
        if isinstance(reply, _StreamedReply):
            await self._stream(reply, receive, send)
            return
        await _send_json(send, status, reply)

    async def _stream(self, reply: "_StreamedReply", receive, send) -> None:
        """Send a large reply a part at a time, each part once the client has read enough of
        the previous ones (uvicorn's flow control), so that the server holds about one part for
        a client that reads slowly; a client that reads nothing for ``send_timeout`` seconds is
        disconnected, and its reply is dropped."""
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        try:
            for part in itertools.chain(reply.parts(), [b""]):
                message = {"type": "http.response.body", "body": part, "more_body": part != b""}
                await asyncio.wait_for(send(message), self.limits.send_timeout)
            return
        except _IndexChanged:  # the rest would be read from changed files: cut the reply
            pass
        except TimeoutError:
            logger.warning(
                "POST /retrieve: the client read nothing of its reply (%d queries) for "
                "%ss; disconnected it",
                len(reply.lengths),
                self.limits.send_timeout,
            )
        drop_connection(receive)
        with contextlib.suppress(TimeoutError):  # uvicorn marks it gone: no error log
            await asyncio.wait_for(receive(), self.limits.body_timeout)

    def stale(self) -> dict | None:
        """``None`` while the served files are as loaded; else the 503 reply (from then on:
        the change is logged once, naming the file)."""
        if self.watch is None:
            return None
        if self._stale is None:
            path = self.watch.changed()
            if path is None:
                return None
            logger.error(
                "the index at %s was changed in place while served (%s changed size or time); "
                "answering 503 until this server is restarted. Restart rag-gym serve; to "
                "replace a served index, use rag-gym index build (it swaps folders atomically)",
                self.watch.folder,
                path,
            )
            self._stale = {
                "error": "the server's index files were changed in place while it served "
                "them; the server must be restarted (see its log)"
            }
        return self._stale

    def _log_unknown(self, names: list[str]) -> None:
        key = tuple(names[:10])
        if key not in self.unknown_logged and len(self.unknown_logged) < 100:
            self.unknown_logged.add(key)
            logger.warning("POST /retrieve: ignoring unknown fields %s", ", ".join(key))

    async def answer(self, body: bytes, gone=None) -> tuple[int, dict]:
        """The status and reply to ``body``; :class:`_ClientGone` when ``gone()`` turns true
        before the reply is built (``gone``: the client's disconnect check, or ``None``)."""
        from pydantic import ValidationError

        try:
            req = self.model.model_validate_json(body)
        except ValidationError as exc:
            errors = [
                f"{'.'.join(str(p) for p in e.get('loc', ())) or 'body'}: {e.get('msg')}"
                for e in exc.errors()
            ]
            return 422, {"error": "invalid request", "details": errors[:10]}
        if req.model_extra:
            self._log_unknown(sorted(req.model_extra))
        limits, n_corpus = self.limits, corpus_size(self.retriever)
        if req.queries is not None and req.query is not None:
            return 422, {"error": "send 'queries' (a list of strings) or 'query', not both"}
        if req.queries is None and req.query is None:
            return 422, {"error": "expected 'queries' (a list of strings) or 'query' (a string)"}
        single = req.queries is None
        queries = [req.query] if single else req.queries
        if len(queries) > limits.max_queries:
            return 422, {
                "error": f"expected at most {limits.max_queries} queries per request, got "
                f"{len(queries)}; split the request (or start the server with a larger "
                "--max-queries)"
            }
        topk = req.topk
        if req.top_k is not None:
            if topk is not None and topk != req.top_k:
                return 422, {"error": f"topk ({topk}) and top_k ({req.top_k}) disagree"}
            topk = req.top_k
        if not topk:  # null or 0: the default, as Search-R1's server reads it
            topk = min(limits.default_topk, n_corpus)
        if topk < 0 or topk > min(limits.max_topk, n_corpus):
            return 422, {
                "error": f"expected 1 <= topk <= {min(limits.max_topk, n_corpus)} (the server's "
                f"limit and corpus size), got {topk}"
            }
        if not queries:
            return 200, {"result": []}
        too_long = [i for i, q in enumerate(queries) if len(q) > limits.max_query_chars]
        if too_long:
            return 422, {
                "error": f"queries {too_long[:5]} are longer than {limits.max_query_chars} "
                "characters"
            }
        for name, value in (("exclude", req.exclude), ("within", req.within)):
            if value is not None and len(value) != len(queries):
                return 422, {
                    "error": f"expected {name} to hold one list per query ({len(queries)}), "
                    f"got {len(value)}"
                }
        within = req.within
        if within is not None:
            within = [list(dict.fromkeys(p)) if p is not None else None for p in within]
            for pool in within:
                if pool is not None and (
                    len(pool) < topk
                    or (not self.remote and any(p not in self.corpus for p in pool))
                ):
                    return 422, {
                        "error": "every within pool must hold at least topk distinct ids of "
                        "the corpus"
                    }
        if gone is not None and gone():
            raise _ClientGone
        if (stale := self.stale()) is not None:
            return 503, stale
        try:
            ids, scores = await self.batcher.submit(queries, topk, req.exclude, within, gone)
        except _ClientGone:
            raise
        except Exception as exc:  # the request was checked above: this is the server's fault
            if self.remote and isinstance(exc, KeyError):  # but a remote index checks pools
                return 422, {"error": f"every within pool must hold ids of the corpus: {exc}"}
            logger.error("retrieval failed", exc_info=exc)
            return 500, {
                "error": f"retrieval failed ({type(exc).__name__}); the index may be damaged: "
                "see the server's log"
            }
        if gone is not None and gone():
            raise _ClientGone
        if (stale := self.stale()) is not None:
            return 503, stale
        if not single and sum(len(row) for row in ids) > self.stream_docs:
            return self.streamed(ids, scores, req.return_scores)
        return self.reply(ids, scores, req.return_scores, single)

    #: a reply of more passages than this is sent a part at a time (:meth:`_stream`)
    stream_docs = 2048

    def streamed(self, ids, scores, return_scores: bool) -> tuple[int, Any]:
        """A 200 reply to send in parts, holding each passage as its row and score (16 bytes)
        until its part is encoded; a 500 if a score is not a number."""
        index = self.corpus._index
        flat = np.fromiter((s for row in scores for s in row), dtype=np.float64)
        bad = np.flatnonzero(~np.isfinite(flat))
        if len(bad):
            return _bad_score([p for row in ids for p in row][bad[0]], flat[bad[0]])
        rows = np.fromiter((index[p] for row in ids for p in row), dtype=np.int64)
        lengths = np.fromiter((len(row) for row in ids), dtype=np.int64)
        return 200, _StreamedReply(self, rows, flat, lengths, return_scores)

    def reply(self, ids, scores, return_scores: bool, single: bool) -> tuple[int, dict]:
        # the corpus's columns directly: a Passage per document would cost more than its query
        index, titles, texts = self.corpus._index, self.corpus.titles, self.corpus.texts
        verbatim = self.contents
        result = []
        for qids, qscores in zip(ids, scores, strict=True):
            docs = []
            for pid, score in zip(qids, qscores, strict=True):
                i = index[pid]
                if verbatim is not None:
                    text = verbatim[i]
                else:
                    text = f"{titles[i]}\n{texts[i]}" if titles[i] else texts[i]
                score = float(score)
                if not math.isfinite(score):
                    return _bad_score(pid, score)
                doc = {"id": pid, "contents": text}
                docs.append({"document": doc, "score": score} if return_scores else doc)
            result.append(docs)
        out: dict[str, Any] = {"result": result}
        if single:  # rLLM's tool reads a flat "results" list of {id, content, score}
            out["results"] = [
                {"id": pid, "content": (d["document"] if return_scores else d)["contents"],
                 "score": float(s)}
                for pid, s, d in zip(ids[0], scores[0], result[0], strict=True)
            ]  # fmt: skip
        return 200, out

    def stop(self) -> None:
        self.batcher.stop()


def _bad_score(pid: str, score) -> tuple[int, dict]:
    """The 500 reply to a passage the index scored ``score``, not a finite number (logged)."""
    logger.error("passage %r scored %r", pid, score)
    return 500, {
        "error": f"the index scored passage {pid!r} {score}, not a number; "
        "the index is damaged: rebuild it"
    }


class _StreamedReply:
    """A ``{"result": [...]}`` reply encoded a few queries at a time (:meth:`parts`), the same
    bytes as encoding it whole."""

    #: bytes of a part
    part_bytes = 1 << 18

    def __init__(self, endpoint, rows, scores, lengths, return_scores: bool) -> None:
        self.endpoint = endpoint
        self.rows = rows
        self.scores = scores
        self.lengths = lengths
        self.return_scores = return_scores

    def parts(self):
        corpus, verbatim = self.endpoint.corpus, self.endpoint.contents
        ids, titles, texts = corpus.ids, corpus.titles, corpus.texts
        out, size, start = [b'{"result":['], 11, 0
        for q, n in enumerate(self.lengths.tolist()):
            if size == 0 and self.endpoint.stale() is not None:
                raise _IndexChanged
            docs = []
            for row, score in zip(
                self.rows[start : start + n].tolist(),
                self.scores[start : start + n].tolist(),
                strict=True,
            ):
                if verbatim is not None:
                    text = verbatim[row]
                else:
                    text = f"{titles[row]}\n{texts[row]}" if titles[row] else texts[row]
                doc = {"id": ids[row], "contents": text}
                docs.append({"document": doc, "score": score} if self.return_scores else doc)
            start += n
            encoded = dumps(docs)
            out.append(b"," + encoded if q else encoded)
            size += len(encoded) + 1
            if size >= self.part_bytes:
                yield b"".join(out)
                out, size = [], 0
        out.append(b"]}")
        yield b"".join(out)


class _Route:
    """ASGI middleware that hands one method and path to ``endpoint`` itself: the hot path skips
    the router and the exception middleware, which cost more per request than a batched
    retrieval does."""

    def __init__(self, app, path: str, method: str, endpoint) -> None:
        self.app = app
        self.path = path
        self.method = method
        self.endpoint = endpoint

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["path"] == self.path:
            if scope["method"] == self.method:
                await self.endpoint(scope, receive, send)
            else:
                await _send_json(send, 405, {"error": f"{self.path} takes {self.method} only"})
            return
        await self.app(scope, receive, send)


class _Guard:
    """ASGI middleware: the bearer token (compared in constant time, the scheme in any case),
    the body size (refused before the body is read), and a 500 with a message, logged, for
    anything the app raises (a fault of the server, not of the request: requests are checked
    before they reach the retriever)."""

    def __init__(self, app, token: str | None, max_body_bytes: int) -> None:
        self.app = app
        self.token = token.encode() if token else None  # "" (an empty $RAG_GYM_TOKEN): none
        self.max_body_bytes = max_body_bytes

    def _authorised(self, headers: dict) -> bool:
        scheme, _, credentials = headers.get(b"authorization", b"").strip().partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(credentials.strip(), self.token)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        if self.token is not None and not self._authorised(headers):
            await _send_json(
                send,
                401,
                {"error": "missing or wrong bearer token (Authorization: Bearer <token>)"},
                extra=[(b"www-authenticate", b"Bearer")],
            )
            return
        size = headers.get(b"content-length")
        if size is not None and (not size.isdigit() or int(size) > self.max_body_bytes):
            await _send_json(
                send, 413, {"error": f"body over {self.max_body_bytes} bytes"}, close=True
            )
            return
        started = False

        async def tracked_send(message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked_send)
        except Exception as exc:
            logger.error("%s %s failed", scope.get("method"), scope.get("path"), exc_info=exc)
            if started:
                raise
            await _send_json(  # the details (paths, say) are for the log, not for clients
                send,
                500,
                {"error": f"internal server error ({type(exc).__name__}): see the server's log"},
            )


async def _send_json(
    send, status: int, content: dict, close: bool = False, extra: list | None = None
) -> None:
    body = dumps(content)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    if extra:
        headers.extend(extra)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class _IndexChanged(Exception):
    """The served index's files were changed in place: nothing more is read from them."""


class _ClientGone(Exception):
    """The client of a request closed its connection before the reply: its work is dropped."""


class _MicroBatcher:
    """Retrieves concurrent requests together.

    A loop takes every request queued so far as one batch (up to ``max_batch`` queries and
    ``max_cost`` queries x k, k being the batch's largest) and hands it to a worker thread; up
    to ``max_in_flight`` batches are retrieved at once, and requests that arrive meanwhile form
    the next batch, so batches grow with the load and no request waits for a timer while the
    server is busy. Only an idle server (nothing in flight) waits up to ``window`` seconds for
    more requests to join a batch. A request over ``max_cost`` is queued in slices, so one
    batch, and what a request queued behind it waits for, stays bounded.

    A request may come with ``gone``, a check of whether its client has left: its slices are
    dropped when a batch is formed and again in the worker thread just before retrieval
    (``dropped`` counts them), and it gets :class:`_ClientGone`.
    """

    def __init__(
        self,
        retriever: Retriever,
        window: float,
        max_batch: int,
        max_in_flight: int,
        max_cost: int = 16_384,
    ):
        from concurrent.futures import ThreadPoolExecutor

        self.retriever = retriever
        self.window = window
        self.max_batch = max_batch
        self.max_in_flight = max_in_flight
        self.max_cost = max_cost
        self.executor = ThreadPoolExecutor(max_in_flight, thread_name_prefix="rag-gym-batch")
        self.queue: asyncio.Queue | None = None
        self.task: asyncio.Task | None = None
        self.held = None  # an item taken from the queue that did not fit its batch: next one's
        self.in_flight = 0
        self.batches = 0
        self.requests = 0
        self.dropped = 0
        self._dropped_lock = threading.Lock()  # the loop and the worker threads count drops

    async def submit(self, queries, k, exclude, within, gone=None):
        """``(ids, scores)`` of ``queries`` at ``k``, retrieved with other requests' queries."""
        loop = asyncio.get_running_loop()
        if self.queue is None:
            self.queue = asyncio.Queue()
            self.task = loop.create_task(self._run())
        step = max(1, self.max_cost // k)
        if len(queries) <= step:
            future = loop.create_future()
            self.queue.put_nowait((queries, k, exclude, within, future, gone))
            return await future
        futures = []
        for s in range(0, len(queries), step):
            cut = slice(s, s + step)
            future = loop.create_future()
            self.queue.put_nowait(
                (
                    queries[cut],
                    k,
                    exclude[cut] if exclude is not None else None,
                    within[cut] if within is not None else None,
                    future,
                    gone,
                )
            )
            futures.append(future)
        try:
            parts = await asyncio.gather(*futures)
        finally:
            for future in futures:  # one slice failed, or the request was cancelled
                future.cancel()
        return [i for p in parts for i in p[0]], [s for p in parts for s in p[1]]

    def _live(self, item) -> bool:
        """Whether ``item`` is still wanted; one whose client has gone is answered
        :class:`_ClientGone` (and counted in ``dropped``)."""
        future, gone = item[4], item[5]
        if future.done():  # cancelled: the request was abandoned
            self._count_dropped(1)
            return False
        if gone is not None and gone():
            future.set_exception(_ClientGone())
            self._count_dropped(1)
            return False
        return True

    def _count_dropped(self, n: int) -> None:
        with self._dropped_lock:
            self.dropped += n

    def _next(self):
        """The next live item without waiting (the held one first), or ``None``."""
        assert self.queue is not None
        while True:
            if self.held is not None:
                item, self.held = self.held, None
            elif not self.queue.empty():
                item = self.queue.get_nowait()
            else:
                return None
            if self._live(item):
                return item

    def _add(self, items: list, item) -> bool:
        """Append ``item`` to the batch ``items`` if it fits (else hold it for the next)."""
        size = sum(len(it[0]) for it in items)
        k = max(item[1], *(it[1] for it in items))
        if size >= self.max_batch or (size + len(item[0])) * k > self.max_cost:
            self.held = item
            return False
        items.append(item)
        return True

    def _drain(self, items: list) -> None:
        while self.held is None:
            item = self._next()
            if item is None or not self._add(items, item):
                return

    async def _run(self) -> None:
        assert self.queue is not None
        loop = asyncio.get_running_loop()
        slots = asyncio.Semaphore(self.max_in_flight)
        while True:
            await slots.acquire()
            first = self._next()
            while first is None:
                first = await self.queue.get()
                if not self._live(first):
                    first = None
            items = [first]
            self._drain(items)
            if self.in_flight == 0 and self.window > 0:
                deadline = loop.time() + self.window
                while self.held is None:
                    timeout = deadline - loop.time()
                    if timeout <= 0:
                        break
                    try:
                        item = await asyncio.wait_for(self.queue.get(), timeout)
                    except TimeoutError:
                        break
                    if self._live(item) and self._add(items, item):
                        self._drain(items)
            self.in_flight += 1
            self.batches += 1
            self.requests += len(items)
            done = loop.run_in_executor(self.executor, self._retrieve, items)
            done.add_done_callback(
                lambda d, items=items, slots=slots: self._deliver(d, items, slots)
            )

    def _deliver(self, done: asyncio.Future, items: list, slots: asyncio.Semaphore) -> None:
        # on the event loop, once per batch: one wake-up of the loop, not one per request
        self.in_flight -= 1
        slots.release()
        failed = done.exception() if not done.cancelled() else asyncio.CancelledError()
        outcomes = [failed] * len(items) if failed is not None else done.result()
        for item, outcome in zip(items, outcomes, strict=True):
            future = item[4]
            if future.done():  # the client went away
                continue
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)

    def _retrieve(self, items) -> list:
        """Each request's ``(ids, scores)``, or the exception its own retrieval raised
        (:class:`_ClientGone` for a request whose client left while it was queued)."""
        gone = [it[5] is not None and it[5]() for it in items]
        if any(gone):  # left while the batch was handed over: retrieve the others
            self._count_dropped(sum(gone))
            live = iter(self._retrieve([it for it, g in zip(items, gone, strict=True) if not g]))
            return [_ClientGone() if g else next(live) for g in gone]
        if not items:
            return []
        try:
            return self._retrieve_together(items)
        except Exception:
            # one bad request must not fail the others: retrieve each on its own
            outcomes = []
            for item in items:
                try:
                    outcomes.extend(self._retrieve_together([item]))
                except Exception as exc:
                    outcomes.append(exc)
            return outcomes

    def _retrieve_together(self, items) -> list:
        # one call for the whole batch at the largest k, cut back per request (a ranking's
        # first k are the same at any larger k); queries with a pool are retrieved one by one
        k = max(item[1] for item in items)
        queries = [q for item in items for q in item[0]]
        exclude = [e for item in items for e in (item[2] or [None] * len(item[0]))]
        within = [w for item in items for w in (item[3] or [None] * len(item[0]))]
        if any(w is not None for w in within):
            results = [
                self.retriever.retrieve([q], item_k, exclude=[e] if e else None, within=[w])
                for q, e, w, item_k in zip(
                    queries, exclude, within, [it[1] for it in items for _ in it[0]], strict=True
                )
            ]
            ids, scores = [r.ids[0] for r in results], [r.scores[0] for r in results]
        elif any(exclude):
            res = self.retriever.retrieve(queries, k, exclude=exclude)
            ids, scores = res.ids, res.scores
        else:
            # the same query from several clients (a GRPO group's first hop) is retrieved once
            unique = list(dict.fromkeys(queries))
            res = self.retriever.retrieve(unique, k)
            if len(unique) < len(queries):
                row = {q: i for i, q in enumerate(unique)}
                ids = [res.ids[row[q]] for q in queries]
                scores = [res.scores[row[q]] for q in queries]
            else:
                ids, scores = res.ids, res.scores
        outcomes, start = [], 0
        for item in items:
            n, item_k = len(item[0]), item[1]
            outcomes.append(
                (
                    [i[:item_k] for i in ids[start : start + n]],
                    [s[:item_k] for s in scores[start : start + n]],
                )
            )
            start += n
        return outcomes

    def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
        self.executor.shutdown(wait=False, cancel_futures=True)

"""A batched retrieval server (FastAPI + uvicorn) and its client, ``HttpRetriever``.

``POST /retrieve`` takes and answers Search-R1's JSON shape, so agents written for Search-R1
work unchanged::

    {"queries": ["..."], "topk": 3, "return_scores": true}
    -> {"result": [[{"document": {"id": "...", "contents": "title\\ntext"}, "score": 1.2}, ...], ...]}

(with ``return_scores`` false each query's list holds the documents alone). rag-gym clients may
add ``exclude`` and ``within`` (per query id lists), which the in-process retrievers take.

Concurrent requests are retrieved together (micro-batching): every request queued while earlier
batches are being retrieved joins the next batch (up to ``max_batch`` queries), and up to
``max_in_flight`` batches run at once in worker threads, so batches grow with the load and a busy
server never waits on a timer; an idle one waits up to ``batch_window_ms`` for company. The
server binds 127.0.0.1 by default; with a token (``--token`` or ``RAG_GYM_TOKEN``) every request
needs ``Authorization: Bearer <token>``. Limits: queries per request, characters per query,
``topk`` (and the request body size); a bad request gets a 4xx with a message, never a 500.
``GET /health`` answers ``{"status": "ok", "corpus_size": N, "kind": ...}``.

Needs ``pip install 'rag-gym[server]'``.
"""

import asyncio
import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from rag_gym.data.types import Corpus, Passage
from rag_gym.retrieval.base import RetrievalResult, Retriever, check_queries, per_query

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


@dataclass(frozen=True)
class ServerLimits:
    """What one request may ask."""

    max_queries: int = 512
    max_query_chars: int = 4096
    max_topk: int = 100
    max_body_bytes: int = 8 * 1024 * 1024


def create_app(
    retriever: Retriever,
    token: str | None = None,
    limits: ServerLimits | None = None,
    batch_window_ms: float = 0.0,
    max_batch: int = 512,
    kind: str = "bm25",
    micro_batching: bool = True,
    max_in_flight: int = 2,
):
    """The FastAPI app serving ``retriever`` (see the module doc).

    Args:
        batch_window_ms: how long an idle server waits for more requests to join a batch; a
            busy one (a batch in flight) dispatches at once what has queued meanwhile.
        max_batch: most queries per batch.
        micro_batching: ``False`` retrieves each request on its own (for comparison).
        max_in_flight: batches retrieved at the same time, each in its own worker thread.
    """
    try:
        from fastapi import FastAPI
        from pydantic import BaseModel, ConfigDict, Field
    except ImportError as exc:
        raise ImportError(
            "the retrieval server needs fastapi and uvicorn: pip install 'rag-gym[server]'"
        ) from exc
    if max_in_flight < 1 or max_batch < 1 or batch_window_ms < 0:
        raise ValueError(
            f"expected max_in_flight >= 1, max_batch >= 1 and batch_window_ms >= 0, got "
            f"{max_in_flight}, {max_batch} and {batch_window_ms}"
        )

    limits = limits or ServerLimits()
    corpus = retriever.corpus

    class RetrieveRequest(BaseModel):
        model_config = ConfigDict(extra="forbid", strict=True)
        queries: list[str] = Field(min_length=1, max_length=limits.max_queries)
        topk: int = Field(default=3, ge=1, le=min(limits.max_topk, len(corpus)))
        return_scores: bool = False
        exclude: list[list[str]] | None = None
        within: list[list[str] | None] | None = None

    app = FastAPI(title="rag-gym retrieval server")
    batcher = (
        _MicroBatcher(retriever, batch_window_ms / 1000.0, max_batch, max_in_flight)
        if micro_batching
        else None
    )
    endpoint = _RetrieveEndpoint(retriever, RetrieveRequest, limits, batcher)
    # POST /retrieve goes straight to its endpoint (middleware order: the last added is outermost)
    app.add_middleware(_Route, path="/retrieve", method="POST", endpoint=endpoint)
    app.add_middleware(_Guard, token=token, max_body_bytes=limits.max_body_bytes)
    app.state.batcher = batcher

    @app.get("/health")
    async def health():
        return {"status": "ok", "corpus_size": len(corpus), "kind": kind}

    @app.on_event("startup")
    async def _settle():
        # the index and the corpus live as long as the server: exempt them from the cyclic
        # garbage collector, whose full passes would otherwise walk millions of their objects
        import gc

        gc.collect()
        gc.freeze()

    @app.on_event("shutdown")
    async def _stop():
        endpoint.stop()

    return app


class _RetrieveEndpoint:
    """``POST /retrieve`` as a plain ASGI app: the body is validated by pydantic straight from
    the JSON bytes and the reply is encoded once, so the request path costs little next to the
    retrieval it serves (FastAPI's dependency machinery and generic encoder cost more than a
    batched BM25 query does)."""

    def __init__(self, retriever: Retriever, model, limits: ServerLimits, batcher) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.retriever = retriever
        self.corpus = retriever.corpus
        self.model = model
        self.limits = limits
        self.batcher = batcher
        # one-request-at-a-time mode: each request retrieved on its own, in a worker thread
        self.executor = None if batcher else ThreadPoolExecutor(thread_name_prefix="rag-gym-one")

    async def __call__(self, scope, receive, send) -> None:
        body = bytearray()
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
        status, reply = await self.answer(bytes(body))
        await _send_json(send, status, reply)

    async def answer(self, body: bytes) -> tuple[int, dict]:
        from pydantic import ValidationError

        try:
            req = self.model.model_validate_json(body)
        except ValidationError as exc:
            errors = [
                f"{'.'.join(str(p) for p in e.get('loc', ())) or 'body'}: {e.get('msg')}"
                for e in exc.errors()
            ]
            return 422, {"error": "invalid request", "details": errors[:10]}
        limit = self.limits.max_query_chars
        too_long = [i for i, q in enumerate(req.queries) if len(q) > limit]
        if too_long:
            return 422, {"error": f"queries {too_long[:5]} are longer than {limit} characters"}
        for name, value in (("exclude", req.exclude), ("within", req.within)):
            if value is not None and len(value) != len(req.queries):
                return 422, {"error": f"{name} needs one list per query"}
        if req.within is not None:
            for pool in req.within:
                if pool is not None and (
                    len(pool) < req.topk or any(p not in self.corpus for p in pool)
                ):
                    return 422, {
                        "error": "every within pool must hold at least topk ids of the corpus"
                    }
        try:
            if self.batcher is not None:
                ids, scores = await self.batcher.submit(
                    req.queries, req.topk, req.exclude, req.within
                )
            else:
                res = await asyncio.get_running_loop().run_in_executor(
                    self.executor,
                    lambda: self.retriever.retrieve(
                        req.queries, req.topk, exclude=req.exclude, within=req.within
                    ),
                )
                ids, scores = res.ids, res.scores
        except (ValueError, KeyError, TypeError) as exc:
            return 422, {"error": str(exc)}
        # the corpus's columns directly: a Passage per document would cost more than its query
        index, titles, texts = self.corpus._index, self.corpus.titles, self.corpus.texts
        result = []
        for qids, qscores in zip(ids, scores, strict=True):
            docs = []
            for pid, score in zip(qids, qscores, strict=True):
                i = index[pid]
                doc = {"id": pid, "contents": f"{titles[i]}\n{texts[i]}" if titles[i] else texts[i]}
                docs.append({"document": doc, "score": float(score)} if req.return_scores else doc)
            result.append(docs)
        return 200, {"result": result}

    def stop(self) -> None:
        if self.batcher is not None:
            self.batcher.stop()
        if self.executor is not None:
            self.executor.shutdown(wait=False, cancel_futures=True)


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
    """ASGI middleware: the bearer token, the body size (refused before the body is read), and
    a 400 with a message instead of a 500 for anything a request makes the app raise."""

    def __init__(self, app, token: str | None, max_body_bytes: int) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode() if token is not None else None
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        if self.expected is not None and headers.get(b"authorization") != self.expected:
            await _send_json(send, 401, {"error": "missing or wrong bearer token"})
            return
        size = headers.get(b"content-length")
        if size is not None and (not size.isdigit() or int(size) > self.max_body_bytes):
            await _send_json(send, 413, {"error": f"body over {self.max_body_bytes} bytes"})
            return
        started = False

        async def tracked_send(message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked_send)
        except Exception as exc:  # never a 500 with a traceback for a client's request
            if started:
                raise
            await _send_json(send, 400, {"error": f"{type(exc).__name__}: {exc}"})


async def _send_json(send, status: int, content: dict) -> None:
    body = dumps(content)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class _MicroBatcher:
    """Retrieves concurrent requests together.

    A loop takes every request queued so far as one batch (up to ``max_batch`` queries) and hands
    it to a worker thread; up to ``max_in_flight`` batches are retrieved at once, and requests
    that arrive meanwhile form the next batch, so batches grow with the load and no request
    waits for a timer while the server is busy. Only an idle server (nothing in flight) waits up
    to ``window`` seconds for more requests to join a batch.
    """

    def __init__(self, retriever: Retriever, window: float, max_batch: int, max_in_flight: int):
        from concurrent.futures import ThreadPoolExecutor

        self.retriever = retriever
        self.window = window
        self.max_batch = max_batch
        self.max_in_flight = max_in_flight
        self.executor = ThreadPoolExecutor(max_in_flight, thread_name_prefix="rag-gym-batch")
        self.queue: asyncio.Queue | None = None
        self.task: asyncio.Task | None = None
        self.in_flight = 0
        self.batches = 0
        self.requests = 0

    async def submit(self, queries, k, exclude, within):
        if self.queue is None:
            self.queue = asyncio.Queue()
            self.task = asyncio.get_running_loop().create_task(self._run())
        future = asyncio.get_running_loop().create_future()
        await self.queue.put((queries, k, exclude, within, future))
        return await future

    def _drain(self, items: list, size: int) -> int:
        assert self.queue is not None
        while size < self.max_batch and not self.queue.empty():
            item = self.queue.get_nowait()
            items.append(item)
            size += len(item[0])
        return size

    async def _run(self) -> None:
        assert self.queue is not None
        loop = asyncio.get_running_loop()
        slots = asyncio.Semaphore(self.max_in_flight)
        while True:
            await slots.acquire()
            items = [await self.queue.get()]
            size = self._drain(items, len(items[0][0]))
            if self.in_flight == 0 and self.window > 0:
                deadline = loop.time() + self.window
                while size < self.max_batch:
                    timeout = deadline - loop.time()
                    if timeout <= 0:
                        break
                    try:
                        item = await asyncio.wait_for(self.queue.get(), timeout)
                    except TimeoutError:
                        break
                    items.append(item)
                    size = self._drain(items, size + len(item[0]))
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
        """Each request's ``(ids, scores)``, or the exception its own retrieval raised."""
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


class HttpRetriever:
    """The retriever protocol over HTTP: ``HttpRetriever("http://127.0.0.1:8000")``.

    Each call is one ``POST /retrieve`` (timeout, retries with backoff on connection errors and
    5xx); a 4xx raises ``ValueError`` with the server's message. The token defaults to
    ``$RAG_GYM_TOKEN``. ``corpus`` holds the passages received so far (its length is the
    server's corpus size), which is what an env renders.
    """

    def __init__(
        self, url: str, token: str | None = None, timeout: float = 30.0, retries: int = 3
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"expected a server URL such as http://127.0.0.1:8000, got {url!r}")
        self.url = url.rstrip("/")
        self.token = token if token is not None else os.environ.get("RAG_GYM_TOKEN")
        self.timeout = timeout
        self.retries = retries
        self._corpus: Corpus | None = None
        health = self._request("GET", "/health")
        self.corpus_size = int(health["corpus_size"])

    def _request(self, method: str, path: str, body: dict | None = None) -> Any:
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        data = dumps(body) if body is not None else None
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(min(0.2 * 2 ** (attempt - 1), 5.0))
            req = urllib.request.Request(self.url + path, data=data, headers=headers, method=method)
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                    return loads(resp.read())
            except urllib.error.HTTPError as exc:
                detail = exc.read().decode(errors="replace")[:300]
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
        """The passages this client has received so far (``len`` is the server's corpus size)."""
        if self._corpus is None:
            self._corpus = _RemoteCorpus(self.corpus_size, name=self.url)
        return self._corpus

    def index(self, corpus: Corpus) -> None:
        raise NotImplementedError(
            "build the index on the server side: rag-gym index build, then rag-gym serve"
        )

    def retrieve(
        self,
        queries: Sequence[str],
        k: int,
        exclude: Sequence[Iterable[str] | None] | None = None,
        within: Sequence[Sequence[str] | None] | None = None,
    ) -> RetrievalResult:
        queries = check_queries(queries)
        body: dict[str, Any] = {"queries": queries, "topk": int(k), "return_scores": True}
        corpus = self.corpus
        if exclude is not None:
            body["exclude"] = [list(e or []) for e in per_query(exclude, len(queries), "exclude")]
        if within is not None:
            body["within"] = [
                list(w) if w is not None else None
                for w in per_query(within, len(queries), "within")
            ]
        reply = self._request("POST", "/retrieve", body)
        for docs in reply["result"]:
            for d in docs:
                doc = d["document"]
                if doc["id"] not in corpus:
                    title, _, text = doc["contents"].partition("\n")
                    corpus.add(Passage(doc["id"], title, text))
        ids = [[d["document"]["id"] for d in docs] for docs in reply["result"]]
        scores = [[float(d["score"]) for d in docs] for docs in reply["result"]]
        return RetrievalResult(ids, scores)

    def passages(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        """The retrieved passages themselves (title and text from ``contents``)."""
        reply = self._request("POST", "/retrieve", {"queries": list(queries), "topk": int(k)})
        out = []
        for docs in reply["result"]:
            row = []
            for d in docs:
                title, _, text = d["contents"].partition("\n")
                row.append(Passage(d["id"], title, text))
            out.append(row)
        return out


class _RemoteCorpus(Corpus):
    """A corpus that holds the passages a server has returned; its length is the server's."""

    __slots__ = ("size",)

    def __init__(self, size: int, name: str) -> None:
        super().__init__(name=name)
        self.size = size

    def __len__(self) -> int:
        return self.size


def load_index(path: str, verify: bool = False):
    """Load a saved index directory of any kind (``params.json`` says which); every file is
    checked against its checksum (sampled, or in full with ``verify``), and a damaged or
    mismatched one is a ``ValueError`` naming it (:func:`rag_gym.retrieval.persist.load_index`)."""
    from rag_gym.retrieval.persist import load_index as load

    return load(path, verify=verify)

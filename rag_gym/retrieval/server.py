"""A batched retrieval server (FastAPI + uvicorn) and its client, ``HttpRetriever``.

``POST /retrieve`` takes and answers Search-R1's JSON shape, so agents written for Search-R1
work unchanged::

    {"queries": ["..."], "topk": 3, "return_scores": true}
    -> {"result": [[{"document": {"id": "...", "contents": "title\\ntext"}, "score": 1.2}, ...], ...]}

(with ``return_scores`` false each query's list holds the documents alone). rag-gym clients may
add ``exclude`` and ``within`` (per query id lists), which the in-process retrievers take.

Requests that arrive within ``batch_window_ms`` of each other are retrieved as one batch (up to
``max_batch`` queries), in a worker thread, so concurrent clients share one retrieval call. The
server binds 127.0.0.1 by default; with a token (``--token`` or ``RAG_GYM_TOKEN``) every request
needs ``Authorization: Bearer <token>``. Limits: queries per request, characters per query,
``topk`` (and the request body size); a bad request gets a 4xx with a message, never a 500.
``GET /health`` answers ``{"status": "ok", "corpus_size": N, "kind": ...}``.

Needs ``pip install 'rag-gym[server]'``.
"""

# no "from __future__ import annotations": FastAPI must see the request model class itself

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
    batch_window_ms: float = 3.0,
    max_batch: int = 512,
    kind: str = "bm25",
    micro_batching: bool = True,
):
    """The FastAPI app serving ``retriever`` (see the module doc). ``micro_batching=False`` gives
    the one-request-at-a-time design (each request retrieved on its own), for comparison."""
    try:
        from fastapi import FastAPI, Request
        from fastapi.exceptions import RequestValidationError
        from fastapi.responses import JSONResponse
        from pydantic import BaseModel, ConfigDict, Field
    except ImportError as exc:
        raise ImportError(
            "the retrieval server needs fastapi and uvicorn: pip install 'rag-gym[server]'"
        ) from exc

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
    batcher = _MicroBatcher(retriever, batch_window_ms / 1000.0, max_batch)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        errors = [
            f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}" for e in exc.errors()
        ]
        return JSONResponse(
            status_code=422, content={"error": "invalid request", "details": errors[:10]}
        )

    @app.middleware("http")
    async def _guard(request: Request, call_next):
        if token is not None and request.headers.get("authorization") != f"Bearer {token}":
            return JSONResponse(status_code=401, content={"error": "missing or wrong bearer token"})
        size = request.headers.get("content-length")
        if size is not None and (not size.isdigit() or int(size) > limits.max_body_bytes):
            return JSONResponse(
                status_code=413, content={"error": f"body over {limits.max_body_bytes} bytes"}
            )
        try:
            return await call_next(request)
        except Exception as exc:  # never a 500 with a traceback for a client's request
            return JSONResponse(status_code=400, content={"error": f"{type(exc).__name__}: {exc}"})

    @app.get("/health")
    async def health():
        return {"status": "ok", "corpus_size": len(corpus), "kind": kind}

    @app.post("/retrieve")
    async def retrieve(req: RetrieveRequest):
        too_long = [i for i, q in enumerate(req.queries) if len(q) > limits.max_query_chars]
        if too_long:
            return JSONResponse(
                status_code=422,
                content={
                    "error": f"queries {too_long[:5]} are longer than {limits.max_query_chars} characters"
                },
            )
        for name, value in (("exclude", req.exclude), ("within", req.within)):
            if value is not None and len(value) != len(req.queries):
                return JSONResponse(
                    status_code=422, content={"error": f"{name} needs one list per query"}
                )
        if req.within is not None:
            for pool in req.within:
                if pool is not None and (
                    len(pool) < req.topk or any(p not in corpus for p in pool)
                ):
                    return JSONResponse(
                        status_code=422,
                        content={
                            "error": "every within pool must hold at least topk ids of the corpus"
                        },
                    )
        try:
            if micro_batching:
                ids, scores = await batcher.submit(req.queries, req.topk, req.exclude, req.within)
            else:
                res = await asyncio.get_running_loop().run_in_executor(
                    None,
                    lambda: retriever.retrieve(
                        req.queries, req.topk, exclude=req.exclude, within=req.within
                    ),
                )
                ids, scores = res.ids, res.scores
        except (ValueError, KeyError, TypeError) as exc:
            return JSONResponse(status_code=422, content={"error": str(exc)})
        result = []
        for qids, qscores in zip(ids, scores, strict=True):
            docs = []
            for pid, score in zip(qids, qscores, strict=True):
                p = corpus[pid]
                doc = {"id": pid, "contents": p.contents}
                docs.append({"document": doc, "score": float(score)} if req.return_scores else doc)
            result.append(docs)
        return {"result": result}

    @app.on_event("shutdown")
    async def _stop():
        batcher.stop()

    return app


class _MicroBatcher:
    """Collects concurrent requests for ``window`` seconds and retrieves them in one call."""

    def __init__(self, retriever: Retriever, window: float, max_batch: int) -> None:
        self.retriever = retriever
        self.window = window
        self.max_batch = max_batch
        self.queue: asyncio.Queue | None = None
        self.task: asyncio.Task | None = None
        self.batches = 0

    async def submit(self, queries, k, exclude, within):
        if self.queue is None:
            self.queue = asyncio.Queue()
            self.task = asyncio.get_running_loop().create_task(self._run())
        future = asyncio.get_running_loop().create_future()
        await self.queue.put((queries, k, exclude, within, future))
        return await future

    async def _run(self) -> None:
        assert self.queue is not None
        loop = asyncio.get_running_loop()
        while True:
            items = [await self.queue.get()]
            deadline = loop.time() + self.window
            size = len(items[0][0])
            while size < self.max_batch:
                timeout = deadline - loop.time()
                if timeout <= 0:
                    break
                try:
                    item = await asyncio.wait_for(self.queue.get(), timeout)
                except TimeoutError:
                    break
                items.append(item)
                size += len(item[0])
            await loop.run_in_executor(None, self._retrieve, items)
            self.batches += 1

    def _retrieve(self, items) -> None:
        # one call per distinct (k, uses exclude/within) group; results cut back per request
        k = max(item[1] for item in items)
        queries = [q for item in items for q in item[0]]
        exclude = [e for item in items for e in (item[2] or [None] * len(item[0]))]
        within = [w for item in items for w in (item[3] or [None] * len(item[0]))]
        try:
            if any(w is not None for w in within):
                results = [
                    self.retriever.retrieve([q], item_k, exclude=[e] if e else None, within=[w])
                    for q, e, w, item_k in zip(
                        queries,
                        exclude,
                        within,
                        [it[1] for it in items for _ in it[0]],
                        strict=True,
                    )
                ]
                ids = [r.ids[0] for r in results]
                scores = [r.scores[0] for r in results]
            else:
                res = self.retriever.retrieve(queries, k, exclude=exclude if any(exclude) else None)
                ids, scores = res.ids, res.scores
        except Exception as exc:
            for item in items:
                item[4].get_loop().call_soon_threadsafe(_set_exception, item[4], exc)
            return
        start = 0
        for item in items:
            n, item_k, future = len(item[0]), item[1], item[4]
            value = (
                [i[:item_k] for i in ids[start : start + n]],
                [s[:item_k] for s in scores[start : start + n]],
            )
            future.get_loop().call_soon_threadsafe(_set_result, future, value)
            start += n

    def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()


def _set_result(future, value) -> None:
    if not future.done():
        future.set_result(value)


def _set_exception(future, exc) -> None:
    if not future.done():
        future.set_exception(exc)


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
        data = json.dumps(body).encode() if body is not None else None
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(min(0.2 * 2 ** (attempt - 1), 5.0))
            req = urllib.request.Request(self.url + path, data=data, headers=headers, method=method)
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                    return json.loads(resp.read().decode())
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


def load_index(path: str):
    """Load a saved index directory of any kind (``params.json`` says which)."""
    from pathlib import Path

    params = Path(path) / "params.json"
    if not params.is_file():
        raise ValueError(
            f"{path} is not a rag-gym index: params.json is missing; build one with rag-gym index build"
        )
    kind = json.loads(params.read_text()).get("kind")
    if kind == "bm25":
        from rag_gym.retrieval.bm25 import BM25Retriever

        return BM25Retriever.load(path), kind
    if kind == "dense":
        from rag_gym.retrieval.dense import DenseRetriever

        return DenseRetriever.load(path), kind
    raise ValueError(f"{params}: expected kind 'bm25' or 'dense', got {kind!r}")

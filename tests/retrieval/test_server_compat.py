"""The field's clients against ``rag-gym serve``, and ``HttpRetriever`` against a Search-R1 server.

Each client's request and reply handling is replayed fresh from its documented shapes (not its
code), against a live server on 127.0.0.1 over a wiki-18-style corpus (quoted titles):

* Search-R1's ``_batch_search`` / ``_passages2string``: ``{"queries", "topk", "return_scores"}``,
  ``Doc i(Title: t) text`` from ``contents``; ``{"queries": []}`` on a turn without searches;
  2,560 queries (512 prompts x 5) in one request.
* verl's ``search_r1_like_utils``: the same batched form, ``Doc i (Title: t)\\ntext``.
* SkyRL-gym's own ``SearchToolGroup.search`` (``{"query": ...}``), when skyrl-gym is installed.
* rLLM's local retrieval tool: ``{"query", "top_k"}``, reading a flat ``results`` list.

Then the server's robustness (stalled clients, server faults, NaN, the token) and
``HttpRetriever`` against a stand-in that answers exactly as Search-R1's ``retrieval_server.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rag_gym.data import Corpus, Passage
from rag_gym.data.synthhop import world_for
from rag_gym.retrieval import BM25Retriever
from rag_gym.retrieval.base import corpus_size
from rag_gym.retrieval.http import HttpRetriever, derived_id
from tests.conftest import SMALL_WORLD

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("fastapi") is None or importlib.util.find_spec("uvicorn") is None,
    reason="needs fastapi and uvicorn: pip install 'rag-gym[server]'",
)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args: list[str], env: dict | None = None, preexec=None, log=None):
    """``rag-gym serve`` in a subprocess on a free port; ``(process, url)`` once it answers."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "rag_gym.cli", "serve", *args, "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=log if log is not None else subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
        preexec_fn=preexec,
        cwd=ROOT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url + "/health", timeout=1).read()
            return proc, url
        except urllib.error.HTTPError:
            return proc, url  # it answers (a 401 with a token)
        except OSError:
            if proc.poll() is not None:
                pytest.fail(f"the server exited with {proc.returncode}")
            time.sleep(0.1)
    proc.kill()
    pytest.fail("the server did not start within 60 s")


def stop(proc) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def post(url: str, body, headers: dict | None = None, timeout: float = 30) -> tuple[int, dict]:
    data = json.dumps(body).encode()
    heads = {"Content-Type": "application/json", "Accept": "application/json", **(headers or {})}
    req = urllib.request.Request(url, data=data, headers=heads, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


# ---- a wiki-18-style corpus and a live server -------------------------------------------------
@pytest.fixture(scope="module")
def wiki(tmp_path_factory):
    """A ``{id, contents}`` JSONL whose titles are quoted, as wiki-18's are, its rows and a BM25
    index built from it."""
    world = world_for("default", **SMALL_WORLD)
    folder = tmp_path_factory.mktemp("wiki")
    path = folder / "wiki.jsonl"
    rows = {}
    with open(path, "w", encoding="utf-8") as f:
        for p in world.corpus:
            rows[p.id] = f'"{p.title}"\n{p.text}'
            f.write(json.dumps({"id": p.id, "contents": rows[p.id]}) + "\n")
    retriever = BM25Retriever(Corpus.from_jsonl(path))
    retriever.save(folder / "bm25")
    queries = [q.question for q in world.questions["validation"]]
    return {"path": path, "rows": rows, "index": folder / "bm25", "bm25": retriever, "q": queries}


@pytest.fixture(scope="module")
def served(wiki, tmp_path_factory):
    """The server over the wiki index with ``--corpus`` (verbatim contents), started with an empty
    ``RAG_GYM_TOKEN``, which means no token."""
    log = open(tmp_path_factory.mktemp("log") / "server.log", "w+b")  # noqa: SIM115
    proc, url = start_server(
        [
            *("--index", str(wiki["index"]), "--corpus", str(wiki["path"])),
            *("--body-timeout", "3", "--head-timeout", "3"),
        ],
        env={"RAG_GYM_TOKEN": ""},
        log=log,
    )
    yield url, log
    stop(proc)
    log.close()


def test_search_r1_batch_search_and_passages(wiki, served):
    url, _ = served
    queries = wiki["q"][:8]
    # _batch_search: the batched form, scores on, reading ['result']
    status, reply = post(url + "/retrieve", {"queries": queries, "topk": 3, "return_scores": True})
    assert status == 200
    expected = wiki["bm25"].retrieve(queries, 3)
    for docs, ids in zip(reply["result"], expected.ids, strict=True):
        # _passages2string: title = the first line of contents, text = the rest
        got = ""
        for i, item in enumerate(docs):
            content = item["document"]["contents"]
            title, text = content.split("\n")[0], "\n".join(content.split("\n")[1:])
            got += f"Doc {i + 1}(Title: {title}) {text}\n"
        want = ""
        for i, pid in enumerate(ids):
            title, text = wiki["rows"][pid].split("\n", 1)
            want += f"Doc {i + 1}(Title: {title}) {text}\n"
        assert got == want and '(Title: "' in got  # the quotes of the corpus row survive
    # a turn in which no rollout searches
    assert post(url + "/retrieve", {"queries": [], "topk": 3, "return_scores": True}) == (
        200,
        {"result": []},
    )
    # 512 prompts x n_agent 5 in one request
    many = [wiki["q"][i % len(wiki["q"])] for i in range(2560)]
    status, reply = post(url + "/retrieve", {"queries": many, "topk": 3, "return_scores": True})
    assert status == 200 and len(reply["result"]) == 2560
    last = wiki["bm25"].retrieve(many[-1:], 3).ids[0]
    assert [d["document"]["id"] for d in reply["result"][-1]] == last


def test_verl_search_tool(wiki, served):
    url, _ = served
    queries = wiki["q"][:4]
    status, reply = post(url + "/retrieve", {"queries": queries, "topk": 2, "return_scores": True})
    assert status == 200
    pretty = []
    for retrieval in reply.get("result", []):
        text_out = ""
        for i, item in enumerate(retrieval):
            content = item["document"]["contents"]
            title, text = content.split("\n")[0], "\n".join(content.split("\n")[1:])
            text_out += f"Doc {i + 1} (Title: {title})\n{text}\n\n"
        pretty.append(text_out.strip())
    expected = wiki["bm25"].retrieve(queries, 2).ids
    want = [
        "\n\n".join(
            f"Doc {i + 1} (Title: {wiki['rows'][pid].split(chr(10), 1)[0]})\n"
            f"{wiki['rows'][pid].split(chr(10), 1)[1]}"
            for i, pid in enumerate(ids)
        )
        for ids in expected
    ]
    assert "\n---\n".join(pretty) == "\n---\n".join(want)


def test_skyrl_gym_search_tool(wiki, served):
    tools = pytest.importorskip("skyrl_gym.tools", reason="needs skyrl-gym: pip install skyrl-gym")
    url, _ = served
    group = tools.SearchToolGroup(search_url=url + "/retrieve", topk=3, log_requests=False)
    query = wiki["q"][0]
    out = json.loads(group.execute_tool("search", query))["result"]
    ids = wiki["bm25"].retrieve([query], 3).ids[0]
    assert out == "".join(f"Doc {i + 1}: {wiki['rows'][pid]}\n" for i, pid in enumerate(ids))


def test_rllm_single_query(wiki, served):
    url, _ = served
    query = wiki["q"][1]
    body = {"query": query, "top_k": 5, "retriever_type": "dense"}
    status, reply = post(url + "/retrieve", body)
    assert status == 200
    expected = wiki["bm25"].retrieve([query], 5)
    results = reply.get("results", [])
    assert [r["id"] for r in results] == expected.ids[0]
    assert [r["content"] for r in results] == [wiki["rows"][p] for p in expected.ids[0]]
    assert [round(r["score"], 4) for r in results] == [round(s, 4) for s in expected.scores[0]]
    # the same request in SkyRL's spelling answers the batched shape of one query
    status, reply = post(url + "/retrieve", {"query": query, "topk": 2, "return_scores": True})
    assert [d["document"]["id"] for d in reply["result"][0]] == expected.ids[0][:2]


@pytest.mark.parametrize(
    ("body", "n_docs", "scored"),
    [
        ({"queries": ["a"], "topk": None}, 3, False),  # null: the default
        ({"queries": ["a"], "topk": 0}, 3, False),  # 0: the default, as Search-R1 reads it
        ({"queries": ["a"], "topk": "2"}, 2, False),  # numeric strings, as pydantic's lax mode
        ({"queries": ["a"], "topk": 2.0, "return_scores": "true"}, 2, True),
        ({"queries": ["a"], "topk": 2, "return_scores": 1}, 2, True),
        ({"queries": ["a"], "topk": 1, "nprobe": 8, "mode": "x"}, 1, False),  # unknown: ignored
    ],
)
def test_lenient_where_search_r1_is(served, body, n_docs, scored):
    url, _ = served
    status, reply = post(url + "/retrieve", body)
    assert status == 200 and len(reply["result"][0]) == n_docs
    assert all(("score" in d) == scored for d in reply["result"][0])


def test_unknown_fields_are_logged_and_healthz(served):
    url, log = served
    post(url + "/retrieve", {"queries": ["a"], "retriever_type": "hybrid"})
    log.seek(0)
    assert b"ignoring unknown fields retriever_type" in log.read()
    for path in ("/health", "/healthz"):
        reply = json.loads(urllib.request.urlopen(url + path, timeout=10).read())
        assert reply["status"] == "ok" and reply["corpus_size"] == 2000


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"queries": ["a"], "topk": -1}, "expected 1 <= topk <= 100"),
        ({"queries": ["a"], "topk": 101}, "expected 1 <= topk <= 100"),
        ({"queries": ["a"] * 4097}, "at most 4096 queries"),
        ({"query": "a", "topk": 2, "top_k": 3}, "disagree"),
        ({"topk": 3}, "expected 'queries'"),
    ],
)
def test_real_limits_still_answer_4xx_with_a_reason(served, body, message):
    url, _ = served
    status, reply = post(url + "/retrieve", body)
    assert status == 422 and message in reply["error"]


# ---- the server under stalled clients ---------------------------------------------------------
def _stall(url: str, n_head: int, n_body: int) -> list[socket.socket]:
    """Open ``n_head`` connections that stop mid-head and ``n_body`` that stop mid-body."""
    port = int(url.rsplit(":", 1)[1])
    socks = []
    for i in range(n_head + n_body):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        if i < n_head:
            s.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Ty")
        else:
            s.sendall(
                b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b'Content-Length: 1000\r\n\r\n{"queries": ["a'
            )
        socks.append(s)
    return socks


def _closed_by_server(s: socket.socket, within: float) -> bytes | None:
    """What the server sent before closing ``s`` (None: still open after ``within`` s)."""
    s.settimeout(within)
    got = b""
    with contextlib.suppress(OSError):
        while chunk := s.recv(4096):
            got += chunk
        return got
    return None


@pytest.mark.slow
def test_stalled_clients_do_not_starve_good_requests(wiki):
    """150 connections stalled mid-head and mid-body at a file limit of 128: every good request
    is answered at once, and every stalled connection is closed."""
    import resource

    def low_file_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128))

    proc, url = start_server(
        ["--index", str(wiki["index"]), "--head-timeout", "1", "--body-timeout", "1"],
        preexec=low_file_limit,
    )
    try:
        socks = _stall(url, 75, 75)
        started = time.monotonic()
        expected = wiki["bm25"].retrieve(wiki["q"][:10], 3).ids
        for q, ids in zip(wiki["q"][:10], expected, strict=True):
            status, reply = post(url + "/retrieve", {"queries": [q], "topk": 3}, timeout=20)
            assert status == 200 and [d["id"] for d in reply["result"][0]] == ids
        assert time.monotonic() - started < 10
        replies = [_closed_by_server(s, 10) for s in socks]
        assert all(r is not None for r in replies), "a stalled connection is still open"
        # mid-body: closed to make room (nothing sent), or 408 once its body timed out
        assert all(r == b"" or r.startswith(b"HTTP/1.1 408") for r in replies[75:])
        assert any(r.startswith(b"HTTP/1.1 408") for r in replies[75:])
    finally:
        for s in locals().get("socks", []):
            s.close()
        stop(proc)


def test_a_stalled_body_gets_408_and_a_stalled_head_is_closed(wiki, served):
    url, _ = served
    head, body = _stall(url, 1, 1)
    try:
        # the served fixture gives a body and a head 3 s each
        started = time.monotonic()
        reply = _closed_by_server(body, 20)
        assert reply is not None and reply.startswith(b"HTTP/1.1 408")
        assert b"did not arrive within 3.0s" in reply
        assert _closed_by_server(head, 20) is not None
        assert time.monotonic() - started < 25
    finally:
        head.close()
        body.close()


def _one_write(url: str, data: bytes) -> bytes | None:
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(data)
        return _closed_by_server(s, 10)


@pytest.mark.parametrize("http", ["h11", "httptools"])
def test_a_request_head_over_the_limit_is_refused_however_it_arrives(wiki, http):
    """A 70 KB head (limit 64 KiB) gets 431 and a closed connection whether it comes in one
    write, in many, or after blank lines; a head under the limit with its body in the same
    write is served."""
    from rag_gym.retrieval.server import ServerLimits, create_app
    from tests.retrieval.test_server_abandoned import live

    app = create_app(wiki["bm25"])
    body = json.dumps({"queries": [wiki["q"][0]], "topk": 3}).encode()
    big = b"X-Pad: " + b"a" * 70_000 + b"\r\n"
    head = b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    request = head + big + b"Content-Length: %d\r\n\r\n" % len(body) + body
    assert ServerLimits().max_head_bytes == 65536
    with live(app, http=http) as (url, _):
        for data in (request, b"\r\n\r\n" + request):
            reply = _one_write(url, data)
            assert reply is not None and reply.startswith(b"HTTP/1.1 431"), reply
        port = int(url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            for i in range(0, len(request), 4096):
                with contextlib.suppress(OSError):
                    s.sendall(request[i : i + 4096])
            reply = _closed_by_server(s, 10)
        assert reply is not None and reply.startswith(b"HTTP/1.1 431")
        small = head + b"X-Pad: " + b"a" * 60_000 + b"\r\nContent-Length: %d\r\n\r\n" % len(body)
        port = int(url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(small + body)
            s.settimeout(10)
            got = s.recv(65536)
        assert got.startswith(b"HTTP/1.1 200"), got[:200]


# ---- server faults, NaN, the token: the app itself, in process ---------------------------------
def call(app, method: str, path: str, body: bytes = b"", headers=()) -> tuple[int, dict, dict]:
    """One request through the ASGI app: ``(status, JSON reply, headers)``."""

    async def run():
        scope = {
            "type": "http",
            "method": method,
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "headers": [(b"content-type", b"application/json"), *headers],
            "http_version": "1.1",
            "scheme": "http",
            "server": ("127.0.0.1", 80),
            "client": ("127.0.0.1", 1),
            "root_path": "",
        }
        sent = []
        messages = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive():
            return messages.pop(0) if messages else {"type": "http.disconnect"}

        async def send(message):
            sent.append(message)

        await app(scope, receive, send)
        start = next(m for m in sent if m["type"] == "http.response.start")
        content = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
        return start["status"], json.loads(content), dict(start["headers"])

    return asyncio.run(run())


class _Broken:
    """A retriever over a damaged index: it raises, or scores NaN."""

    def __init__(self, corpus, mode: str) -> None:
        self.corpus = corpus
        self.mode = mode

    def retrieve(self, queries, k, exclude=None, within=None):
        from rag_gym.retrieval.base import RetrievalResult

        if self.mode == "index":
            raise IndexError("index 7 is out of bounds for axis 0 with size 3")
        return RetrievalResult([["b", "a"] for _ in queries], [[math.nan, 1.0] for _ in queries])


SMALL = Corpus([Passage("a", "A", "alpha"), Passage("b", "B", "beta"), Passage("c", "", "gamma")])


def test_server_faults_answer_5xx_and_nan_never_reaches_clients():
    from rag_gym.retrieval.server import create_app

    body = json.dumps({"queries": ["q"], "topk": 2, "return_scores": True}).encode()
    app = create_app(_Broken(SMALL, "index"))
    status, reply, _ = call(app, "POST", "/retrieve", body)
    assert status == 500 and "IndexError" in reply["error"] and "damaged" in reply["error"]
    app = create_app(_Broken(SMALL, "nan"))
    status, reply, _ = call(app, "POST", "/retrieve", body)
    assert status == 500 and "not a number" in reply["error"] and "null" not in json.dumps(reply)


@pytest.mark.parametrize(
    ("header", "code"),
    [
        (None, 401),
        (b"Bearer s3cret", 200),
        (b"bearer s3cret", 200),
        (b"BEARER  s3cret ", 200),
        (b"Bearer s3cre", 401),
        (b"Bearer s3cret2", 401),
        (b"Basic s3cret", 401),
        (b"s3cret", 401),
    ],
)
def test_token(header, code):
    from rag_gym.retrieval.server import create_app

    app = create_app(BM25Retriever(SMALL), token="s3cret")
    headers = [(b"authorization", header)] if header else []
    status, _, heads = call(app, "GET", "/health", headers=headers)
    assert status == code
    if code == 401:
        assert heads[b"www-authenticate"] == b"Bearer"


def test_an_empty_token_means_none():
    from rag_gym.retrieval.server import create_app

    assert call(create_app(BM25Retriever(SMALL), token=""), "GET", "/healthz")[0] == 200


def test_token_is_compared_in_constant_time(monkeypatch):
    import hmac

    from rag_gym.retrieval.server import create_app

    seen = []
    real = hmac.compare_digest
    monkeypatch.setattr(hmac, "compare_digest", lambda a, b: seen.append((a, b)) or real(a, b))
    app = create_app(BM25Retriever(SMALL), token="s3cret")
    call(app, "GET", "/health", headers=[(b"authorization", b"Bearer guess")])
    assert seen == [(b"guess", b"s3cret")]


# ---- HttpRetriever against a stand-in for Search-R1's retrieval_server.py -------------------------
class SearchR1Standin:
    """Search-R1's ``retrieval_server.py`` JSON, exactly: ``POST /retrieve`` only (no
    ``/health``: 404), lax ``QueryRequest`` fields, unknown fields (``exclude``, ``within``)
    ignored, ``topk`` null or 0 meaning 3, documents as the corpus rows (dense:
    ``{"id", "contents"}``) or as Pyserini gives them (``{"title", "text", "contents"}``, no
    id). ``broken_unscored`` answers 500 to ``return_scores: false``, as a server whose unscored
    path breaks does."""

    def __init__(self, retriever, rows: dict, pyserini: bool = False, broken_unscored=False):
        self.retriever, self.rows = retriever, rows
        self.pyserini, self.broken_unscored = pyserini, broken_unscored
        self.bodies: list[dict] = []
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def reply(self, code: int, obj) -> None:
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self.reply(404, {"detail": "Not Found"})

            def do_POST(self):
                if self.path != "/retrieve":
                    return self.reply(404, {"detail": "Not Found"})
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                standin.bodies.append(body)
                code, obj = standin.answer(body)
                self.reply(code, obj)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def document(self, pid: str) -> dict:
        contents = self.rows[pid]
        if self.pyserini:
            return {
                "title": contents.split("\n")[0].strip('"'),
                "text": "\n".join(contents.split("\n")[1:]),
                "contents": contents,
            }
        return {"id": pid, "contents": contents}

    def answer(self, body: dict):
        queries = body.get("queries")
        if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
            return 422, {"detail": "queries: Input should be a valid list"}
        topk = int(body.get("topk") or 3)
        scored = body.get("return_scores") in (True, "true", 1)
        if not scored and self.broken_unscored:
            return 500, "Internal Server Error"
        res = self.retriever.retrieve(queries, topk) if queries else None
        result = []
        for i in range(len(queries)):
            docs = [self.document(pid) for pid in res.ids[i]]
            if scored:
                result.append(
                    [{"document": d, "score": s} for d, s in zip(docs, res.scores[i], strict=True)]
                )
            else:
                result.append(docs)
        return 200, {"result": result}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def standin(wiki):
    servers = []

    def make(**kwargs) -> SearchR1Standin:
        servers.append(SearchR1Standin(wiki["bm25"], wiki["rows"], **kwargs))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


def test_http_retriever_needs_no_health_and_matches_in_process(wiki, standin):
    server = standin()
    client = HttpRetriever(server.url, retries=0)
    assert client.corpus_size is None and not client.honours_filters
    assert corpus_size(client) == sys.maxsize  # unknown, never the reason to lower k
    sized = HttpRetriever(server.url + "/retrieve", corpus_size=2000)
    assert corpus_size(sized) == 2000
    assert len(sized.corpus) == 0  # it holds no passage yet
    sized.retrieve(wiki["q"][:2], 3)
    # len counts the passages it holds, each one it can render
    assert 3 <= len(sized.corpus) <= 6
    assert all(sized.corpus[pid].text for pid in sized.corpus.ids)
    queries = wiki["q"][:6]
    got, want = client.retrieve(queries, 4), wiki["bm25"].retrieve(queries, 4)
    assert got.ids == want.ids
    assert [[round(s, 4) for s in r] for r in got.scores] == [
        [round(s, 4) for s in r] for r in want.scores
    ]
    # the passages read as the in-process corpus reads the same file
    pid = want.ids[0][0]
    assert client.corpus[pid] == wiki["bm25"].corpus[pid]
    assert client.retrieve([], 3).ids == []


def test_http_retriever_derives_ids_for_pyserini_documents(wiki, standin):
    server = standin(pyserini=True)
    client = HttpRetriever(server.url, retries=0)
    query = wiki["q"][2]
    first, again = client.retrieve([query], 3), client.retrieve([query], 3)
    want = wiki["bm25"].retrieve([query], 3).ids[0]
    assert first.ids == again.ids == [[derived_id(wiki["rows"][p]) for p in want]]
    passage = client.corpus[first.ids[0][0]]
    assert (passage.title, passage.text) == (
        wiki["bm25"].corpus[want[0]].title,
        wiki["bm25"].corpus[want[0]].text,
    )


def test_http_retriever_applies_exclude_a_server_ignores(wiki, standin):
    server = standin()
    client = HttpRetriever(server.url, retries=0)
    queries = wiki["q"][:5]
    top = wiki["bm25"].retrieve(queries, 6).ids
    exclude = [ids[:3] for ids in top]  # the three best of each query
    got = client.retrieve(queries, 3, exclude=exclude)
    assert got.ids == wiki["bm25"].retrieve(queries, 3, exclude=exclude).ids
    assert all(not set(g) & set(e) for g, e in zip(got.ids, exclude, strict=True))
    assert server.bodies[-1]["topk"] == 6  # asked for k + the excluded ids, in one request


def test_http_retriever_applies_within_or_says_it_cannot(wiki, standin):
    server = standin()
    client = HttpRetriever(server.url, retries=0, max_overfetch=64)
    query = wiki["q"][3]
    ranked = wiki["bm25"].retrieve([query], 40).ids[0]
    pool = [ranked[9], ranked[4], ranked[20], ranked[30]]  # deep in the ranking: over-fetched
    got = client.retrieve([query], 3, within=[pool])
    assert got.ids == wiki["bm25"].retrieve([query], 3, within=[pool]).ids
    # a pool the server's top 64 does not reach cannot be served by a server that ignores it
    far = wiki["bm25"].retrieve([query], 2000).ids[0][-3:]
    with pytest.raises(ValueError, match=r"does not honour within= .* such as rag-gym serve"):
        client.retrieve([query], 3, within=[far])


def test_http_retriever_passages_never_asks_for_unscored_replies(wiki, standin):
    server = standin(broken_unscored=True)
    client = HttpRetriever(server.url, retries=0)
    rows = client.passages(wiki["q"][:2], 2)
    want = wiki["bm25"].retrieve(wiki["q"][:2], 2).ids
    assert [[p.id for p in row] for row in rows] == want
    assert all(b["return_scores"] is True for b in server.bodies)


def test_http_retriever_uses_filters_of_a_rag_gym_server(wiki, served):
    url, _ = served
    client = HttpRetriever(url)
    assert client.honours_filters and client.corpus_size == 2000
    query = wiki["q"][0]
    top = wiki["bm25"].retrieve([query], 5).ids[0]
    got = client.retrieve([query], 2, exclude=[top[:2]], within=[top])
    assert got.ids == [top[2:4]]


# ---- an index changed in place while served ----------------------------------------------------
@pytest.mark.slow
def test_an_index_overwritten_in_place_gets_503_and_a_log_line_not_sigbus(wiki, tmp_path):
    """``cp -r`` of another index over the served folder rewrites its files in place (the
    mapped ones shrink): the server stays up, answers 503 naming the fix, says so in its log,
    and /health reports it; an index rebuilt with ``rag-gym index build`` (an atomic swap)
    keeps being served as loaded."""
    served_dir = tmp_path / "served"
    shutil.copytree(wiki["index"], served_dir)
    other = tmp_path / "other"
    BM25Retriever(Corpus([Passage("z1", "", "tiny"), Passage("z2", "", "corpus")])).save(other)
    log = open(tmp_path / "server.log", "w+b")  # noqa: SIM115
    proc, url = start_server(["--index", str(served_dir)], log=log)
    try:
        q = wiki["q"][:5]
        want = wiki["bm25"].retrieve(q, 3).ids
        status, reply = post(url + "/retrieve", {"queries": q, "topk": 3})
        assert status == 200 and [[d["id"] for d in r] for r in reply["result"]] == want
        subprocess.run(["cp", "-r", f"{other}/.", str(served_dir)], check=True)
        for _ in range(3):
            status, reply = post(url + "/retrieve", {"queries": q, "topk": 3})
            assert status == 503 and "changed in place" in reply["error"]
            assert "must be restarted" in reply["error"]
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(url + "/health", timeout=5)
        assert info.value.code == 503
        assert proc.poll() is None, f"the server died ({proc.returncode})"
        log.seek(0)
        text = log.read().decode()
        assert f"the index at {served_dir} was changed in place while served" in text
        assert "use rag-gym index build" in text
    finally:
        stop(proc)
        log.close()

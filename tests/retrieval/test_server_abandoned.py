"""The retrieval server under abandoned requests and misbehaving peers, on 127.0.0.1 with real
sockets: work for a client that has gone never reaches a batch, a batch is bounded in queries x
k, 500 replies keep server paths to the log, and ``HttpRetriever`` notices a server restarted on
another index and refuses replies that cannot be right."""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import json
import logging
import math
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest

from rag_gym.data import Corpus, Passage
from rag_gym.data.synthhop import world_for
from rag_gym.retrieval import BM25Retriever
from rag_gym.retrieval.http import HttpRetriever, clean_token
from tests.conftest import SMALL_WORLD

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("fastapi") is None or importlib.util.find_spec("uvicorn") is None,
    reason="needs fastapi and uvicorn: pip install 'rag-gym[server]'",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def live(app, port: int | None = None, http: str = "auto", limits=None):
    """``app`` served by :func:`~rag_gym.retrieval.server.make_server` (rag-gym serve's uvicorn
    set-up) in a thread on 127.0.0.1; yields its URL and stops it on exit."""
    from rag_gym.retrieval.server import make_server

    port = port or free_port()
    server = make_server(app, "127.0.0.1", port, limits=limits, http=http)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    for _ in range(500):  # up to 5 s
        if server.started:
            break
        if not thread.is_alive():
            pytest.fail("the server thread exited")
        time.sleep(0.01)
    else:
        pytest.fail("the server did not start within 5 s")
    try:
        yield f"http://127.0.0.1:{port}", server
    finally:
        server.should_exit = True
        thread.join(10)


def post(url: str, body: dict, timeout: float = 30) -> tuple[int, dict]:
    data = json.dumps(body).encode()
    req = urllib.request.Request(
        url + "/retrieve", data=data, headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def abandon(url: str, body: dict) -> None:
    """Send ``body`` to ``/retrieve`` and close the socket at once, reading nothing."""
    data = json.dumps(body).encode()
    host, port = url.removeprefix("http://").split(":")
    head = (
        f"POST /retrieve HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    ).encode()
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(head + data)


class Recording:
    """BM25 that records each call's queries and k, and holds calls while its gate is shut."""

    def __init__(self, corpus) -> None:
        self.inner = BM25Retriever(corpus)
        self.corpus = corpus
        self.calls: list[tuple[list[str], int]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    def retrieve(self, queries, k, exclude=None, within=None):
        self.calls.append((list(queries), k))
        self.entered.set()
        assert self.gate.wait(30), "the test never opened the gate"
        return self.inner.retrieve(queries, k, exclude=exclude, within=within)


@pytest.fixture(scope="module")
def world():
    return world_for("default", **SMALL_WORLD)


def test_work_of_clients_that_left_never_reaches_a_batch(world):
    """40 requests of 50 queries at topk 20, each socket closed as soon as it is sent, queue
    behind a batch held in retrieval: none of their queries is retrieved once it is released,
    and the good requests around them get their own, correct results."""
    from rag_gym.retrieval.server import create_app

    retriever = Recording(world.corpus)
    app = create_app(retriever, max_in_flight=1)
    good = [q.question for q in world.questions["validation"][:2]]
    expected = BM25Retriever(world.corpus).retrieve(good, 3).ids
    flood = [[f"flood {i} query {j} city" for j in range(50)] for i in range(40)]
    replies: dict[int, tuple[int, dict]] = {}

    def ask(i: int) -> None:
        replies[i] = post(url, {"queries": [good[i]], "topk": 3})

    class Errors(logging.Handler):
        def __init__(self) -> None:
            super().__init__(logging.ERROR)
            self.messages: list[str] = []

        def emit(self, record) -> None:
            self.messages.append(record.getMessage())

    errors = Errors()
    with live(app) as (url, server):
        logging.getLogger("uvicorn.error").addHandler(errors)
        retriever.gate.clear()
        first = threading.Thread(target=ask, args=(0,))
        first.start()
        assert retriever.entered.wait(10), "the first request was never retrieved"
        for queries in flood:
            abandon(url, {"queries": queries, "topk": 20})
        # the server has seen every flood connection close (bounded wait, no timing asserted)
        for _ in range(1000):
            if len(server.server_state.connections) <= 1:
                break
            time.sleep(0.01)
        second = threading.Thread(target=ask, args=(1,))
        second.start()
        for _ in range(1000):  # the good request is queued behind the held batch
            if len(server.server_state.connections) >= 2:
                break
            time.sleep(0.01)
        retriever.gate.set()
        first.join(30)
        second.join(30)
        batcher = app.state.batcher
        logging.getLogger("uvicorn.error").removeHandler(errors)
    retrieved = {q for queries, _ in retriever.calls for q in queries}
    assert not retrieved & {q for queries in flood for q in queries}
    assert retrieved == set(good)
    assert [[d["id"] for d in replies[i][1]["result"][0]] for i in (0, 1)] == expected
    assert replies[0][0] == replies[1][0] == 200
    assert batcher.dropped <= len(flood)  # those seen gone once queued (others: before)
    assert errors.messages == []  # a client that left is not a fault of the server


def test_a_batch_is_bounded_in_queries_times_k(world):
    """With max_batch_cost 200, a request of 64 queries at topk 10 is retrieved in slices of at
    most 200 passages ranked, and concurrent one-query requests join batches under the same
    bound; every reply equals the in-process ranking."""
    from rag_gym.retrieval.server import create_app

    retriever = Recording(world.corpus)
    app = create_app(retriever, max_batch_cost=200)
    queries = [q.question for q in world.questions["train"][:64]]
    reference = BM25Retriever(world.corpus)
    small: dict[str, tuple[int, dict]] = {}

    def ask(q: str) -> None:
        small[q] = post(url, {"query": q, "topk": 5})

    with live(app) as (url, _):
        threads = [threading.Thread(target=ask, args=(q,)) for q in queries[:8]]
        for t in threads:
            t.start()
        status, reply = post(url, {"queries": queries, "topk": 10})
        for t in threads:
            t.join(30)
    assert status == 200
    assert [[d["id"] for d in r] for r in reply["result"]] == reference.retrieve(queries, 10).ids
    expected = dict(zip(queries[:8], reference.retrieve(queries[:8], 5).ids, strict=True))
    assert {q: (s, [d["id"] for d in r["result"][0]]) for q, (s, r) in small.items()} == {
        q: (200, ids) for q, ids in expected.items()
    }
    assert max(len(qs) * k for qs, k in retriever.calls) <= 200
    assert sum(len(qs) for qs, _ in retriever.calls) >= 64


def test_a_500_keeps_server_paths_in_the_log(world):
    from rag_gym.retrieval.server import create_app

    class Broken:
        corpus = world.corpus

        def retrieve(self, queries, k, exclude=None, within=None):
            raise OSError("/srv/secret/indexes/wiki/doc_ids.npy: Input/output error")

    with live(create_app(Broken())) as (url, _):
        status, reply = post(url, {"queries": ["x"], "topk": 2})
    assert status == 500 and "OSError" in reply["error"], reply
    assert "/srv" not in json.dumps(reply) and "server's log" in reply["error"]


def _corpus(texts: list[str]) -> Corpus:
    return Corpus([Passage(f"p{i}", f"T{i}", t) for i, t in enumerate(texts)])


def test_a_server_restarted_on_another_index_is_noticed(tmp_path):
    """The same ids with other texts behind the same URL: a new env gets the new index, and a
    client made before receives the new texts, never the ones it held."""
    import rag_gym  # noqa: F401  (registers the envs)
    from rag_gym.envs.search import SearchEnv
    from rag_gym.retrieval.server import create_app

    old = _corpus([f"alpha river number {i}" for i in range(20)])
    new = _corpus([f"alpha mountain number {i}" for i in range(20)])
    port = free_port()
    qa = [{"id": "q1", "question": "alpha number?", "answer": "x"}]
    data = tmp_path / "qa.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in qa))
    kwargs = dict(dataset="bamboogle", data_path=str(data), corpus_mode="corpus")
    with live(create_app(BM25Retriever(old)), port) as (url, _):
        before = SearchEnv(retriever=url, **kwargs)
        client = HttpRetriever(url)
        assert client.retrieve(["alpha"], 5).ids and not client.index_changed()
        assert all("river" in client.corpus[p].text for p in client.corpus.ids)
    with live(create_app(BM25Retriever(new)), port) as (url, _):
        after = SearchEnv(retriever=url, **kwargs)
        assert client.index_changed() and after.retriever is not before.retriever
        ids = client.retrieve(["alpha"], 5).ids[0]
        assert all("mountain" in client.corpus[p].text for p in ids)
        got = after.retriever.retrieve(["alpha"], 5).ids[0]
        assert all("mountain" in after.corpus[p].text for p in got)


class _Standin:
    """A Search-R1-shaped server that answers what ``reply(queries, topk)`` returns."""

    def __init__(self, reply) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                data = json.dumps({"result": outer.reply(body["queries"], body["topk"])})
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data.encode())

            def do_GET(self):  # no /health, as Search-R1's server
                self.send_error(404)

            def log_message(self, *args):
                pass

        self.reply = reply
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _doc(pid: str, score) -> dict:
    return {"document": {"id": pid, "contents": f"T\n{pid} text"}, "score": score}


@pytest.mark.parametrize(
    ("docs", "message"),
    [
        ([_doc("a", 2.0), _doc("a", 1.0), _doc("b", 0.5)], "returned passage 'a' twice"),
        ([_doc("a", 2.0), _doc("b", "NaN"), _doc("c", 0.5)], "finite number, got 'NaN'"),
        ([_doc("a", 2.0), _doc("b", "high"), _doc("c", 0.5)], "finite number, got 'high'"),
        ([_doc("a", 2.0), _doc("b", 1.0)], "returned 2 passages for a query, where 3"),
    ],
)
def test_http_retriever_refuses_replies_that_cannot_be_right(docs, message):
    standin = _Standin(lambda queries, topk: [docs for _ in queries])
    try:
        client = HttpRetriever(standin.url, corpus_size=100, retries=0)
        with pytest.raises(ValueError, match=message):
            client.retrieve(["q"], 3)
    finally:
        standin.close()


def test_http_retriever_takes_a_short_reply_from_a_small_corpus():
    standin = _Standin(lambda queries, topk: [[_doc("a", 2.0), _doc("b", 1.0)] for _ in queries])
    try:
        client = HttpRetriever(standin.url, corpus_size=2, retries=0)
        result = client.retrieve(["q"], 2)
        assert result.ids == [["a", "b"]] and all(math.isfinite(s) for s in result.scores[0])
    finally:
        standin.close()


def test_tokens_with_whitespace_around_are_stripped_with_a_warning():
    with pytest.warns(UserWarning, match=r"whitespace around it \(' abc'\); using 'abc'"):
        assert clean_token(" abc", "--token") == "abc"
    with pytest.warns(UserWarning, match="using 'abc'"):
        assert clean_token("abc\n", "$RAG_GYM_TOKEN") == "abc"
    with pytest.raises(ValueError, match="only whitespace"):
        clean_token(" \n", "--token")
    with pytest.raises(ValueError, match="visible ASCII characters only"):
        clean_token("ab c", "--token")
    with pytest.raises(ValueError, match="visible ASCII characters only"):
        clean_token("abç", "--token")


def test_a_token_given_with_a_newline_still_lets_clients_in(world, monkeypatch):
    """The server started with ``"s3cret\\n"`` (a token file read into the variable) and a
    client whose $RAG_GYM_TOKEN ends in a newline talk to each other."""
    from rag_gym.retrieval.server import create_app

    with pytest.warns(UserWarning, match="whitespace around it"):
        app = create_app(BM25Retriever(world.corpus), token="s3cret\n")
    with live(app) as (url, _):
        monkeypatch.setenv("RAG_GYM_TOKEN", "s3cret\n")
        with pytest.warns(UserWarning, match="whitespace around it"):
            client = HttpRetriever(url, retries=0)
        assert client.retrieve(["alpha"], 2).ids[0]
        monkeypatch.setenv("RAG_GYM_TOKEN", "wrong")
        with pytest.raises(ValueError, match="401"):
            HttpRetriever(url, retries=0)


@pytest.mark.slow
def test_serve_strips_a_token_given_with_spaces_and_says_so(world, tmp_path):
    """``rag-gym serve --token " abc"``: a warning on stderr, and clients sending ``abc`` get in
    (before, every client was locked out)."""
    import subprocess
    import sys

    index = tmp_path / "bm25"
    BM25Retriever(world.corpus).save(index)
    port = free_port()
    log = tmp_path / "serve.log"
    serve = ["serve", "--index", str(index), "--port", str(port), "--token", " abc"]
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rag_gym.cli", *serve],
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        url = f"http://127.0.0.1:{port}/health"
        req = urllib.request.Request(url, headers={"Authorization": "Bearer abc"})
        for _ in range(600):  # up to 60 s for the server to start
            try:
                with urllib.request.urlopen(req, timeout=1) as resp:
                    status = resp.status
                break
            except urllib.error.HTTPError as exc:
                status = exc.code
                break
            except OSError:
                if proc.poll() is not None:
                    pytest.fail(f"the server exited: {log.read_text()[-500:]}")
                time.sleep(0.1)
        else:
            pytest.fail("the server did not start within 60 s")
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert status == 200
    assert "warning: --token has whitespace around it (' abc'); using 'abc'" in log.read_text()


@pytest.mark.slow
def test_a_large_reply_is_streamed_and_a_client_that_never_reads_it_is_dropped(world, caplog):
    """A reply of 4,096 queries x topk 100 is sent a part at a time, byte for byte the reply
    encoded whole; a client that sends it and reads nothing is disconnected after
    ``send_timeout`` (a reset), with a log line, while a good client is answered meanwhile."""
    import select

    from rag_gym.retrieval.server import ServerLimits, create_app

    retriever = BM25Retriever(world.corpus)
    limits = ServerLimits(send_timeout=1.0)
    queries = [f"{p.title} {i}" for i, p in zip(range(4096), itertools.cycle(world.corpus))]
    body = {"queries": queries, "topk": 100, "return_scores": True}
    want = retriever.retrieve(queries, 100)
    with live(create_app(retriever, limits=limits), limits=limits) as (url, _):
        status, reply = post(url, body, timeout=120)
        assert status == 200 and len(reply["result"]) == 4096
        assert [[d["document"]["id"] for d in r] for r in reply["result"]] == want.ids
        assert [[d["score"] for d in r] for r in reply["result"]] == [
            [float(x) for x in row] for row in want.scores
        ]
        host, port = url.removeprefix("http://").split(":")
        data = json.dumps(body).encode()
        silent = socket.socket()
        silent.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        silent.connect((host, int(port)))
        with caplog.at_level(logging.WARNING, logger="rag_gym.retrieval.server"):
            silent.sendall(
                b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n" % len(data) + data
            )
            poller = select.poll()
            poller.register(silent.fileno(), select.POLLHUP | select.POLLERR | select.POLLRDHUP)
            started = time.monotonic()
            while not poller.poll(0) and time.monotonic() - started < 60:
                assert post(url, {"queries": ["alpha"], "topk": 3})[0] == 200
                time.sleep(0.2)
            assert poller.poll(0), "the client that reads nothing is still connected"
        assert "read nothing of its reply (4096 queries) for 1.0s" in caplog.text
        silent.close()

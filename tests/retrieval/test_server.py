"""The retrieval server on 127.0.0.1: identical results to in-process and loaded indexes,
Search-R1's JSON shape, auth, limits and fuzzed requests (4xx, never 500), the env over HTTP."""

from __future__ import annotations

import importlib.util
import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import gymnasium as gym
import pytest

import rag_gym  # noqa: F401
from rag_gym.data.synthhop import world_for
from rag_gym.retrieval import BM25Retriever
from rag_gym.retrieval.server import HttpRetriever
from tests.conftest import SMALL_WORLD

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("fastapi") is None or importlib.util.find_spec("uvicorn") is None,
    reason="needs fastapi and uvicorn: pip install 'rag-gym[server]'",
)
TOKEN = "s3cret"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def world():
    return world_for("default", **SMALL_WORLD)


@pytest.fixture(scope="module")
def server(world, tmp_path_factory):
    index = tmp_path_factory.mktemp("index") / "bm25"
    BM25Retriever(world.corpus).save(index)
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rag_gym.cli",
            "serve",
            "--index",
            str(index),
            "--port",
            str(port),
            "--token",
            TOKEN,
            "--max-queries",
            "64",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            req = urllib.request.Request(
                url + "/health", headers={"Authorization": f"Bearer {TOKEN}"}
            )
            urllib.request.urlopen(req, timeout=1).read()
            break
        except OSError:
            if proc.poll() is not None:
                pytest.fail(f"the server exited: {proc.stderr.read().decode()[-500:]}")
            time.sleep(0.1)
    yield url, index
    proc.terminate()
    proc.wait(timeout=10)


def post(url: str, body, token: str | None = TOKEN, raw: bytes | None = None) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = raw if raw is not None else json.dumps(body).encode()
    req = urllib.request.Request(url + "/retrieve", data=data, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def test_identical_in_process_loaded_and_served(world, server):
    url, index = server
    queries = [q.question for q in world.questions["validation"]]
    in_process = BM25Retriever(world.corpus).retrieve(queries, k=5)
    loaded = BM25Retriever.load(index).retrieve(queries, k=5)
    served = HttpRetriever(url, token=TOKEN).retrieve(queries, k=5)
    assert in_process.ids == loaded.ids == served.ids
    assert [[round(s, 4) for s in row] for row in served.scores] == [
        [round(s, 4) for s in row] for row in in_process.scores
    ]


def test_search_r1_shape(world, server):
    url, _ = server
    status, reply = post(url, {"queries": ["a", "b"], "topk": 2, "return_scores": True})
    assert status == 200 and len(reply["result"]) == 2
    first = reply["result"][0][0]
    assert set(first) == {"document", "score"} and set(first["document"]) == {"id", "contents"}
    assert first["document"]["contents"] == world.corpus[first["document"]["id"]].contents
    status, reply = post(url, {"queries": ["a"], "topk": 1})
    assert status == 200 and set(reply["result"][0][0]) == {"id", "contents"}


@pytest.mark.parametrize(
    ("body", "raw", "token", "code"),
    [
        ({"queries": ["a"]}, None, None, 401),
        ({"queries": ["a"]}, None, "wrong", 401),
        ({"queries": "a"}, None, TOKEN, 422),
        ({"queries": None}, None, TOKEN, 422),
        ({"queries": [1, 2]}, None, TOKEN, 422),
        ({"queries": ["a"], "topk": -1}, None, TOKEN, 422),
        ({"queries": ["a"], "topk": 10**9}, None, TOKEN, 422),
        ({"queries": ["a"], "topk": "three"}, None, TOKEN, 422),
        ({"queries": ["a"] * 65}, None, TOKEN, 422),
        ({"queries": ["x" * 5000]}, None, TOKEN, 422),
        ({"queries": ["a"], "query": "a"}, None, TOKEN, 422),
        (None, b"{not json", TOKEN, 422),
        ({"queries": ["a"], "within": [["nope", "no", "n"]]}, None, TOKEN, 422),
        ({"queries": ["a"], "exclude": [[], []]}, None, TOKEN, 422),
    ],
)
def test_bad_requests_get_4xx_with_a_message(server, body, raw, token, code):
    url, _ = server
    status, reply = post(url, body, token=token, raw=raw)
    assert status == code and reply


def test_huge_body_is_refused_before_it_is_read(server):
    import http.client
    from urllib.parse import urlparse

    url, _ = server
    conn = http.client.HTTPConnection(urlparse(url).hostname, urlparse(url).port, timeout=10)
    conn.putrequest("POST", "/retrieve")
    conn.putheader("Authorization", f"Bearer {TOKEN}")
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Content-Length", str(64 * 1024 * 1024))
    conn.endheaders()
    response = conn.getresponse()
    assert response.status == 413 and b"body over" in response.read()
    conn.close()


def test_concurrent_clients_are_batched(world, server):
    from concurrent.futures import ThreadPoolExecutor

    url, _ = server
    client = HttpRetriever(url, token=TOKEN)
    queries = [q.question for q in world.questions["train"][:40]]
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda q: client.retrieve([q], k=3).ids[0], queries))
    assert results == BM25Retriever(world.corpus).retrieve(queries, k=3).ids


def test_env_searches_through_the_server(world, server):
    import gc
    import os

    url, _ = server

    def counted(env):
        """Count the retrieve calls of the env's own retriever."""
        retriever = env.unwrapped.retriever
        calls = []
        inner = retriever.retrieve
        retriever.retrieve = lambda *a, **kw: calls.append(1) or inner(*a, **kw)
        return calls

    def make(**kw):
        return gym.make("rag_gym/SynthHop-v0", split="validation", dataset_kwargs=SMALL_WORLD, **kw)

    os.environ["RAG_GYM_TOKEN"] = TOKEN
    try:  # a URL string, as a registration kwarg would give it
        env_local = make()
        env_http = make(retriever=url)  # made while a local env with the same data is alive
        assert isinstance(env_http.unwrapped.retriever, HttpRetriever)
        assert isinstance(env_local.unwrapped.retriever, BM25Retriever)
        local_calls, http_calls = counted(env_local), counted(env_http)
        for env in (env_local, env_http):
            env.reset(seed=4)
        q = env_local.unwrapped.current_example.question
        a = env_local.step({"type": 0, "text": q})
        assert (len(local_calls), len(http_calls)) == (1, 0)
        b = env_http.step({"type": 0, "text": q})
        assert (len(local_calls), len(http_calls)) == (1, 1)
        assert a[4]["retrieved_ids"] == b[4]["retrieved_ids"] and a[0] == b[0]
        # the reverse: a local env made while only an HTTP env is alive searches locally
        del env_local, a
        gc.collect()
        env_local = make()
        assert isinstance(env_local.unwrapped.retriever, BM25Retriever)
        assert make(retriever=url).unwrapped.retriever is env_http.unwrapped.retriever
    finally:
        del os.environ["RAG_GYM_TOKEN"]


def test_unreachable_server():
    with pytest.raises(ConnectionError, match="is rag-gym serve running"):
        HttpRetriever(f"http://127.0.0.1:{free_port()}", timeout=1, retries=0)
    with pytest.raises(ValueError, match="expected a server URL"):
        HttpRetriever("localhost:8000")


class _Gated:
    """A retriever that records each call and, when gated, holds it until the gate opens."""

    def __init__(self, corpus) -> None:
        import threading

        self.inner = BM25Retriever(corpus)
        self.corpus = corpus
        self.calls: list[int] = []
        self.gate = threading.Event()
        self.gate.set()

    def retrieve(self, queries, k, exclude=None, within=None):
        self.calls.append(len(queries))
        self.gate.wait(30)
        return self.inner.retrieve(queries, k, exclude=exclude, within=within)


def test_micro_batcher_shares_calls_between_concurrent_requests(world):
    import asyncio

    from rag_gym.retrieval.server import _MicroBatcher

    queries = [q.question for q in world.questions["train"][:24]]
    expected = BM25Retriever(world.corpus).retrieve(queries, k=3)
    retriever = _Gated(world.corpus)
    batcher = _MicroBatcher(retriever, window=0.0, max_batch=512, max_in_flight=1)

    async def play():
        # requests queued together form one batch, whatever each asks (k, exclude)
        together = await asyncio.gather(
            *(batcher.submit([q], 3 if i % 2 else 2, None, None) for i, q in enumerate(queries))
        )
        # requests that arrive while a batch is being retrieved form the next batch
        retriever.gate.clear()
        first = asyncio.ensure_future(batcher.submit(queries[:1], 3, None, None))
        while not retriever.calls[1:]:
            await asyncio.sleep(0.001)
        later = [asyncio.ensure_future(batcher.submit([q], 3, None, None)) for q in queries[1:9]]
        await asyncio.sleep(0.05)
        retriever.gate.set()
        return together, await first, await asyncio.gather(*later)

    together, first, later = asyncio.run(play())
    batcher.stop()
    assert retriever.calls == [24, 1, 8]
    # the same query asked by several requests of a batch is retrieved once
    retriever.calls.clear()
    batcher = _MicroBatcher(retriever, window=0.0, max_batch=512, max_in_flight=1)

    async def repeated():
        asks = [queries[i % 3] for i in range(12)]
        return await asyncio.gather(*(batcher.submit([q], 3, None, None) for q in asks))

    repeats = asyncio.run(repeated())
    batcher.stop()
    assert retriever.calls == [3]
    assert [ids[0] for ids, _ in repeats] == [expected.ids[i % 3] for i in range(12)]
    assert [ids[0] for ids, _ in together] == [
        ids[: 3 if i % 2 else 2] for i, ids in enumerate(expected.ids)
    ]
    assert [first[0][0]] + [ids[0] for ids, _ in later] == expected.ids[:9]


def test_server_options_are_checked(world):
    from rag_gym.retrieval.server import create_app

    with pytest.raises(ValueError, match="expected max_in_flight >= 1"):
        create_app(BM25Retriever(world.corpus), max_in_flight=0)


def test_a_failing_request_does_not_fail_its_batch(world):
    import asyncio

    from rag_gym.retrieval.server import _MicroBatcher

    class Picky(_Gated):
        def retrieve(self, queries, k, exclude=None, within=None):
            if "boom" in queries:
                raise ValueError("boom is not a query")
            return super().retrieve(queries, k, exclude=exclude, within=within)

    queries = [q.question for q in world.questions["train"][:2]]
    batcher = _MicroBatcher(Picky(world.corpus), window=0.0, max_batch=512, max_in_flight=1)

    async def play():
        asks = [queries[0], "boom", queries[1]]
        return await asyncio.gather(
            *(batcher.submit([q], 3, None, None) for q in asks), return_exceptions=True
        )

    first, failed, last = asyncio.run(play())
    batcher.stop()
    assert isinstance(failed, ValueError) and "boom is not a query" in str(failed)
    expected = BM25Retriever(world.corpus).retrieve(queries, k=3).ids
    assert [first[0][0], last[0][0]] == expected

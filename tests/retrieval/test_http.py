"""``HttpRetriever`` against stand-in servers on 127.0.0.1: a redirect to another origin never
carries the bearer token, and a ``/health`` whose ``corpus_size`` is not a passage count is
refused naming the server."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rag_gym.retrieval.http import HttpRetriever

TOKEN = "s3cret"


class Standin:
    """A server that answers ``GET /health`` with ``health``, or redirects every request to
    ``redirect + path`` (status ``code``), recording the ``Authorization`` header of each."""

    def __init__(self, health=None, redirect: str | None = None, code: int = 302) -> None:
        outer = self
        self.seen: list[tuple[str, str | None]] = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                outer.seen.append((self.path, self.headers.get("Authorization")))
                if outer.redirect is not None and not self.path.startswith("/here"):
                    self.send_response(outer.code)
                    self.send_header("Location", outer.redirect + self.path)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                data = json.dumps(outer.health).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.health, self.redirect, self.code = health, redirect, code
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def standins():
    made: list[Standin] = []

    def make(**kwargs) -> Standin:
        made.append(Standin(**kwargs))
        return made[-1]

    yield make
    for s in made:
        s.close()


HEALTH = {"status": "ok", "corpus_size": 12, "kind": "bm25"}


@pytest.mark.parametrize("code", [301, 302, 303, 307, 308])
def test_a_redirect_to_another_host_never_carries_the_token(standins, code):
    other = standins(health=HEALTH)
    first = standins(health=HEALTH, redirect=other.url, code=code)
    client = HttpRetriever(first.url, token=TOKEN, retries=0)
    assert client.corpus_size == 12  # the redirect was followed
    assert first.seen == [("/health", f"Bearer {TOKEN}")]
    assert other.seen == [("/health", None)]  # another port: another origin


def test_a_redirect_on_the_same_server_keeps_the_token(standins):
    server = standins(health=HEALTH)
    server.redirect = server.url + "/here"  # the same scheme, host and port
    client = HttpRetriever(server.url, token=TOKEN, retries=0)
    assert client.corpus_size == 12
    assert server.seen == [("/health", f"Bearer {TOKEN}"), ("/here/health", f"Bearer {TOKEN}")]


@pytest.mark.parametrize("size", [[1], -5, True, 1.5, "12", {"n": 1}])
def test_a_health_corpus_size_that_is_not_a_count_is_refused(standins, size):
    server = standins(health={**HEALTH, "corpus_size": size})
    with pytest.raises(ValueError, match=rf"{server.url}/health: expected corpus_size to be a "):
        HttpRetriever(server.url, retries=0)


def test_a_health_corpus_size_of_zero_or_more_is_taken(standins):
    for size in (0, 7):
        assert (
            HttpRetriever(standins(health={**HEALTH, "corpus_size": size}).url).corpus_size == size
        )


@pytest.mark.parametrize("size", [-1, True, 2.5, "3"])
def test_a_corpus_size_argument_that_is_not_a_count_is_refused(size):
    with pytest.raises(ValueError, match="expected corpus_size= to be a passage count"):
        HttpRetriever("http://127.0.0.1:1", corpus_size=size, retries=0)

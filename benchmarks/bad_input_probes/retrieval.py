"""Retrieval's bad inputs and faults: a sharded rebuild over the user's files, shard counts
(``--shards``), a served index changed in place, request heads over 64 KiB however they are sent,
redirects to another origin (the bearer token), a ``/health`` corpus size that is not a count,
clients that never read a large reply, and ``serve --ray`` replicas the cluster lacks CPUs for.

Handled cleanly: a typed error naming the files, the bound or the server, before any work and
without deleting anything; a served index changed in place answers 503 with a log line; an
oversized head gets 431; the token never leaves its origin; a silent client is dropped and the
server's memory stays bounded.
"""

from __future__ import annotations

import contextlib
import json
import select
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from rag_gym.data import Corpus, Passage
from rag_gym.retrieval import BM25Retriever

ROOT = Path(__file__).resolve().parent.parent if "benchmarks" in __file__ else Path.cwd()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _corpus_file(path: Path, n: int, long_every: int = 7) -> Path:
    Corpus(
        [
            Passage(f"p{i}", "", ("long " * 300 if i % long_every == 0 else "w") + f" {i}")
            for i in range(n)
        ]
    ).to_jsonl(path)
    return path


def _snapshot(root: Path) -> list:
    return sorted(
        (p.relative_to(root).as_posix(), p.read_bytes() if p.is_file() else None)
        for p in root.rglob("*")
    )


# ---- sharded rebuilds over the user's files ----------------------------------------------------
def probe_sharded_rebuild(tmp: Path) -> tuple[int, int]:
    """A sharded rebuild over a folder holding anything of the user's: refused with
    FileExistsError naming a file, and the folder byte for byte as it was; over the index's own
    files (or an empty folder, or with force) it succeeds."""
    from rag_gym.retrieval.shards import build_bm25_shards, read_shards

    corpus = _corpus_file(tmp / "rebuild.jsonl", 12)
    tried = clean = 0
    foreign = {
        "a file beside shards.json": "notes.txt",
        "a file in a shard folder": "shard-000/mine.txt",
        "a file in a shard's bm25s folder": "shard-001/bm25s/extra.npy",
        "a folder named like a shard holding no index": "shard-007/x.txt",
        "a file named like a shard": "shard-003",
        "a nested user folder": "results/run1/episodes.jsonl",
        "a hidden file": ".env",
    }
    for i, (label, rel) in enumerate(foreign.items()):
        tried += 1
        out = build_bm25_shards(corpus, tmp / f"shr{i}", 2)
        target = out / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(f"the user's {label}")
        before = _snapshot(out)
        try:
            build_bm25_shards(corpus, out, 3)
        except FileExistsError as exc:
            clean += rel.split("/")[0] in str(exc) and _snapshot(out) == before
        except Exception:
            pass
    # a folder that is no sharded index at all
    plain = tmp / "shr-plain"
    plain.mkdir()
    (plain / "thesis.tex").write_text("years")
    tried += 1
    try:
        build_bm25_shards(corpus, plain, 2)
    except FileExistsError as exc:
        clean += "thesis.tex" in str(exc) and (plain / "thesis.tex").read_text() == "years"
    # what must still work: its own files, an empty folder, force
    out = build_bm25_shards(corpus, tmp / "shr-own", 2)
    for label, call in {
        "over its own files": lambda: build_bm25_shards(corpus, out, 3),
        "into an empty folder": lambda: build_bm25_shards(
            corpus, (tmp / "shr-empty").mkdir() or tmp / "shr-empty", 2
        ),
        "with force over a user's file": lambda: build_bm25_shards(corpus, plain, 2, force=True),
    }.items():
        tried += 1
        ok = False
        with contextlib.suppress(Exception):
            ok = bool(read_shards(call()))
        clean += ok
        if not ok:
            print(f"  sharded build {label}: failed")
    return tried, clean


# ---- shard counts --------------------------------------------------------------------------------------
def probe_shard_count(tmp: Path) -> tuple[int, int]:
    """Each bad --shards value refused at once (under 2 s) with a typed error naming the bound,
    nothing written; S from 1 to the passage count (uneven passages) builds with >= 1 passage a
    shard; the CLI refuses 2**63 with exit 2-style error and no traceback."""
    from rag_gym.retrieval.shards import build_bm25_shards, read_shards

    corpus = _corpus_file(tmp / "count.jsonl", 30)
    tried = clean = 0
    bad = {
        31: (ValueError, "<= 30"),
        1_000_000: (ValueError, "<= 30"),
        2**63: (ValueError, "<= 30"),
        10**100: (ValueError, "<= 30"),
        0: (ValueError, ">= 1"),
        -1: (ValueError, ">= 1"),
        True: (TypeError, "an int"),
        2.0: (TypeError, "an int"),
        "3": (TypeError, "an int"),
        None: (TypeError, "an int"),
    }
    for value, (kind, words) in bad.items():
        tried += 1
        out = tmp / f"cnt-{len(str(value))}-{tried}"
        t0 = time.perf_counter()
        try:
            build_bm25_shards(corpus, out, value)
        except kind as exc:
            clean += words in str(exc) and time.perf_counter() - t0 < 2 and not out.exists()
        except Exception:
            pass
    for s in (1, 2, 7, 15, 29, 30):
        tried += 1
        with contextlib.suppress(Exception):
            sizes = [
                e["size"]
                for e in read_shards(build_bm25_shards(corpus, tmp / f"ok{s}", s))["shards"]
            ]
            clean += len(sizes) == s and min(sizes) >= 1 and sum(sizes) == 30
    for value in ("9223372036854775808", "1000000", "31", "0"):
        tried += 1
        t0 = time.perf_counter()
        run = subprocess.run(
            [sys.executable, "-m", "rag_gym.cli", "index", "build", "--corpus", str(corpus),
             "--shards", value, "--out", str(tmp / f"cli{value[:4]}")],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        clean += (
            run.returncode != 0
            and "Traceback" not in run.stderr
            and "shard count" in run.stdout + run.stderr
            and time.perf_counter() - t0 < 60
        )
    return tried, clean


# ---- a served index changed in place --------------------------------------------------------
def _start_serve(index: Path, log) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "rag_gym.cli", "serve", "--index", str(index), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            urllib.request.urlopen(url + "/health", timeout=1).read()
            return proc, url
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.1)
    raise RuntimeError("rag-gym serve did not start")


def _post(url: str, body: dict, timeout: float = 30) -> tuple[int | str, dict]:
    req = urllib.request.Request(
        url + "/retrieve", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")
    except OSError as exc:
        return type(exc).__name__, {}


def probe_index_overwrite(tmp: Path) -> tuple[int, int]:
    """A served folder changed in place in several ways, while a client keeps sending requests:
    the server stays up, its answers are the loaded index's (200) or 503 naming the restart,
    never anything else, and its log says which folder changed. An atomic swap (index build)
    keeps it serving the loaded index."""
    words = ["alpha", "beta", "gamma", "delta", "omega"]
    served = BM25Retriever(
        Corpus([Passage(f"s{i}", "", f"{words[i % 5]} text number {i}") for i in range(3000)])
    )
    other = tmp / "ovr-other"
    BM25Retriever(Corpus([Passage("z1", "", "tiny"), Passage("z2", "", "corpus")])).save(other)
    bigger = tmp / "ovr-bigger"
    BM25Retriever(
        Corpus([Passage(f"b{i}", "", f"{words[i % 5]} other words {i}") for i in range(6000)])
    ).save(bigger)
    want = served.retrieve(words, 5).ids

    def copy_over(src):
        return lambda d: subprocess.run(["cp", "-r", f"{src}/.", str(d)], check=True)

    def truncate_one(d):
        big = max((p for p in d.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
        with open(big, "r+b") as f:
            f.truncate(big.stat().st_size // 2)

    def same_size_rewrite(d):
        big = max((p for p in d.rglob("*.npy")), key=lambda p: p.stat().st_size)
        data = bytearray(big.read_bytes())
        data[-100:] = bytes(100)
        with open(big, "r+b") as f:  # in place: same inode, same size
            f.write(data)

    def atomic_rebuild(d):
        from rag_gym.retrieval.persist import check_target

        check_target(d)
        BM25Retriever(Corpus([Passage("n1", "", "new index")])).save(d)

    changes = {
        "cp -r a smaller index over it": (copy_over(other), 503),
        "cp -r a larger index over it": (copy_over(bigger), 503),
        "truncate its largest file": (truncate_one, 503),
        "rewrite a file in place at the same size": (same_size_rewrite, 503),
        "rebuild it with index build (atomic swap)": (atomic_rebuild, 200),
    }
    tried = clean = 0
    for i, (label, (change, expect)) in enumerate(changes.items()):
        folder = tmp / f"ovr{i}"
        served.save(folder)
        log = open(tmp / f"ovr{i}.log", "w+b")  # noqa: SIM115
        proc, url = _start_serve(folder, log)
        statuses: list = []
        stop = threading.Event()

        def flow(url=url, statuses=statuses, stop=stop):
            while not stop.is_set():
                status, reply = _post(url, {"queries": words, "topk": 5})
                ids = [[d["id"] for d in r] for r in reply.get("result", [])]
                statuses.append(status if status != 200 or ids == want else "wrong")

        try:
            tried += 1
            flowing = threading.Thread(target=flow, daemon=True)
            flowing.start()
            time.sleep(0.5)
            change(folder)
            time.sleep(1.0)
            stop.set()
            flowing.join(30)
            after = [_post(url, {"queries": words, "topk": 5})[0] for _ in range(3)]
            alive = proc.poll() is None
            log.seek(0)
            text = log.read().decode(errors="replace")
            ok = alive and set(statuses) <= {200, 503} and after == [expect] * 3
            if not ok:
                print(f"  served index {label}: alive {alive}, after {after}")
            if expect == 503:
                ok = ok and f"the index at {folder} was changed in place" in text
            clean += ok
        finally:
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(20)
            log.close()
    return tried, clean


# ---- request heads -----------------------------------------------------------------------
def _closed_reply(s: socket.socket, within: float = 10) -> bytes | None:
    s.settimeout(within)
    got = b""
    with contextlib.suppress(OSError):
        while chunk := s.recv(4096):
            got += chunk
        return got
    return got or None


def probe_request_heads(tmp: Path) -> tuple[int, int]:
    """Heads over 64 KiB sent in one write, in many, after blank lines, with LF-only line ends,
    with the body in the same write: 431 and the connection closed, under both uvicorn
    parsers; a head just under the limit is served."""
    from rag_gym.retrieval.server import create_app, make_server

    retriever = BM25Retriever(Corpus([Passage(f"h{i}", "", f"head words {i}") for i in range(50)]))
    body = json.dumps({"queries": ["head"], "topk": 3}).encode()
    pad = b"X-Pad: " + b"a" * 70_000 + b"\r\n"
    start = b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    tail = b"Content-Length: %d\r\n\r\n" % len(body)
    over = {
        "70 KB in one write": [start + pad + tail + body],
        "70 KB in 4 KiB writes": [
            (start + pad + tail + body)[i : i + 4096] for i in range(0, 71_000, 4096)
        ],
        "blank lines first": [b"\r\n\r\n\r\n" + start + pad + tail + body],
        "LF-only line ends": [(start + pad + tail).replace(b"\r\n", b"\n") + body],
        "many small headers": [start + b"".join(b"X-H%d: v\r\n" % i for i in range(9000)) + tail],
        "65,537 bytes exactly": [
            start + b"X-Pad: " + b"a" * (65_537 - len(start) - 9 - len(tail)) + b"\r\n" + tail
        ],
    }
    tried = clean = 0
    for http in ("httptools", "h11"):
        port = _free_port()
        server = make_server(create_app(retriever), "127.0.0.1", port, http=http)
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        while not server.started:
            time.sleep(0.01)
        try:
            for _label, writes in over.items():
                tried += 1
                with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                    for w in writes:
                        with contextlib.suppress(OSError):
                            s.sendall(w)
                    reply = _closed_reply(s)
                clean += reply is not None and reply.startswith(b"HTTP/1.1 431")
            tried += 1
            under = start + b"X-Pad: " + b"a" * 60_000 + b"\r\n" + tail + body
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(under)
                s.settimeout(10)
                clean += s.recv(65536).startswith(b"HTTP/1.1 200")
        finally:
            server.should_exit = True
            thread.join(10)
    return tried, clean


# ---- redirects ---------------------------------------------------------------------------
class _Standin:
    def __init__(self, health=None, redirect=None, code=302) -> None:
        outer = self
        self.seen: list = []

        class Handler(BaseHTTPRequestHandler):
            def _answer(self):
                outer.seen.append(self.headers.get("Authorization"))
                if outer.redirect is not None:
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

            do_GET = do_POST = _answer

            def log_message(self, *args):
                pass

        self.health, self.redirect, self.code = health, redirect, code
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def probe_redirect_token() -> tuple[int, int]:
    """HttpRetriever with a bearer token against a server that redirects /health to another
    origin (another port, another host name for the same machine, another scheme): the other
    origin never sees the token, for every redirect status."""
    from rag_gym.retrieval.http import HttpRetriever

    health = {"status": "ok", "corpus_size": 5, "kind": "bm25"}
    tried = clean = 0
    for code in (301, 302, 303, 307, 308):
        for kind in ("another port", "localhost for 127.0.0.1"):
            tried += 1
            other = _Standin(health=health)
            target = (
                other.url if kind == "another port" else other.url.replace("127.0.0.1", "localhost")
            )
            first = _Standin(redirect=target, code=code)
            try:
                client = HttpRetriever(first.url, token="s3cret", retries=0)
                clean += (
                    client.corpus_size == 5
                    and first.seen == ["Bearer s3cret"]
                    and other.seen == [None]
                )
            except Exception:
                pass
            finally:
                first.close()
                other.close()
    return tried, clean


# ---- /health corpus_size -----------------------------------------------------------------
def probe_health_size() -> tuple[int, int]:
    """A /health corpus_size that is not an int >= 0: ValueError naming the server."""
    from rag_gym.retrieval.http import HttpRetriever

    tried = clean = 0
    for size in ([1], -5, True, False, 1.5, "12", {"n": 1}, "", [], 1e300):
        tried += 1
        server = _Standin(health={"status": "ok", "corpus_size": size, "kind": "bm25"})
        try:
            HttpRetriever(server.url, retries=0)
        except ValueError as exc:
            clean += f"{server.url}/health" in str(exc) and "corpus_size" in str(exc)
        except Exception:
            pass
        finally:
            server.close()
    return tried, clean


# ---- unread replies ----------------------------------------------------------------------
def probe_unread_replies(tmp: Path, n_silent: int = 8) -> tuple[int, int]:
    """``n_silent`` clients each send 4,096 queries x topk 100 and read nothing: each is
    disconnected within send_timeout (2 s) plus the time to retrieve, and the server's RSS grows
    by less than a third of the replies it would otherwise hold; a good client's replies are
    all right meanwhile. One tried per silent client, plus one for the memory."""
    corpus = Corpus(
        [Passage(f"u{i}", f"T{i}", f"word{i % 97} passage text {i} " * 8) for i in range(3000)]
    )
    retriever = BM25Retriever(corpus)
    index = tmp / "unread-index"
    retriever.save(index)
    port = _free_port()
    code = (
        "from rag_gym.retrieval import load_index\n"
        "from rag_gym.retrieval.server import ServerLimits, create_app, run_server\n"
        "limits = ServerLimits(send_timeout=2.0)\n"
        f"r, _ = load_index({str(index)!r})\n"
        f"run_server(create_app(r, limits=limits), port={port}, limits=limits)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(url + "/health", timeout=1).read()
                break
            except OSError:
                time.sleep(0.1)
        body = json.dumps(
            {"queries": [f"word{i % 97} {i}" for i in range(4096)], "topk": 100}
        ).encode()
        one = len(
            urllib.request.urlopen(
                urllib.request.Request(
                    url + "/retrieve", body, {"Content-Type": "application/json"}
                ),
                timeout=300,
            ).read()
        )

        def rss() -> float:
            for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
            return 0.0

        before = peak = rss()
        socks = []
        for _ in range(n_silent):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.connect(("127.0.0.1", port))
            s.sendall(
                b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n" % len(body) + body
            )
            socks.append(s)
        flags = select.POLLHUP | select.POLLERR | select.POLLRDHUP
        closed = [False] * n_silent
        good_ok = True
        deadline = time.monotonic() + 120
        while not all(closed) and time.monotonic() < deadline:
            peak = max(peak, rss())
            for i, s in enumerate(socks):
                poller = select.poll()
                poller.register(s.fileno(), flags)
                closed[i] = closed[i] or bool(poller.poll(0))
            status, reply = _post(url, {"queries": ["word5 5"], "topk": 3})
            good_ok = (
                good_ok
                and status == 200
                and (
                    [d["id"] for d in reply["result"][0]]
                    == retriever.retrieve(["word5 5"], 3).ids[0]
                )
            )
            time.sleep(0.2)
        for s in socks:
            s.close()
        tried = n_silent + 1
        clean = sum(closed) + (good_ok and peak - before < n_silent * one / 3)
        return tried, clean
    finally:
        proc.terminate()
        proc.wait(30)


# ---- serve --ray CPUs --------------------------------------------------------------------
def probe_ray_cpus() -> tuple[int, int]:
    """Replica layouts needing more CPUs than a cluster has: refused at once naming the need and
    the cluster's CPUs (a stand-in for Ray's resource calls; no cluster is started)."""
    from rag_gym.retrieval.ray_shards import _check_cpus

    class FakeRay:
        def __init__(self, total):
            self.total = total

        def cluster_resources(self):
            return {"CPU": self.total} if self.total is not None else {}

        def available_resources(self):
            return self.cluster_resources()

    tried = clean = 0
    for total, shards, replicas, cpus in [
        (4, 4, 2, 1.0), (1, 2, 1, 1.0), (None, 1, 1, 1.0), (0, 1, 1, 0.5), (16, 4, 4, 1.5),
        (2, 1, 3, 1.0), (8, 64, 1, 0.25),
    ]:  # fmt: skip
        tried += 1
        t0 = time.perf_counter()
        try:
            _check_cpus(FakeRay(total), shards, replicas, cpus)
        except ValueError as exc:
            clean += (
                "need" in str(exc)
                and "the Ray cluster has" in str(exc)
                and time.perf_counter() - t0 < 1
            )
    for bad in (0, -1.0, float("nan")):
        tried += 1
        from rag_gym.retrieval.ray_shards import RayShardedRetriever

        try:
            RayShardedRetriever("/nonexistent", cpus_per_replica=bad)
        except ValueError as exc:
            clean += "cpus_per_replica" in str(exc)
        except Exception:
            pass
    return tried, clean


def probes(tmp: Path) -> dict[str, tuple[int, int]]:
    """(tried, handled cleanly) per category, each probe in a folder of its own."""
    found = {}
    for label, probe in (
        ("sharded rebuilds over the user's files", probe_sharded_rebuild),
        ("shard counts (--shards)", probe_shard_count),
        ("a served index changed in place (cp -r, truncation, rewrite)", probe_index_overwrite),
        ("request heads over 64 KiB, however sent", probe_request_heads),
        ("redirects to another origin (bearer token)", probe_redirect_token),
        ("/health corpus_size that is not a count", probe_health_size),
        ("clients that never read a large reply", probe_unread_replies),
        ("serve --ray replicas the cluster lacks CPUs for", probe_ray_cpus),
    ):
        sub = tmp / probe.__name__
        sub.mkdir()
        found[label] = probe(sub) if probe.__code__.co_argcount else probe()
    return found

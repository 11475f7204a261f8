"""Clients that never read their replies: does ``rag-gym serve``'s memory stay bounded?

    python benchmarks/server_unread.py --clients 16 --queries 4096 --topk 100

Starts ``rag-gym serve`` over a SynthHop BM25 index in a subprocess on 127.0.0.1 (with
``--send-timeout``, the seconds a reply may wait for its client to read), then:

* ``--clients`` sockets each send one request of ``--queries`` queries at topk ``--topk``
  (the largest request the server accepts by default) and never read a byte of the reply, but
  keep their connection open;
* meanwhile a good client sends one-query requests and checks every reply against the
  in-process ranking.

Prints the server's resident memory (``/proc/PID/status`` VmRSS) before the flood, its peak while
the unread replies are held, and after the server has dropped the clients that read nothing for
``--send-timeout`` seconds; what one reply weighs; and the good client's replies (answered,
wrong). Target: the peak grows by far less than ``--clients`` times a reply, the good replies are
all right, and the memory returns once the silent clients are dropped. Linux only (reads
``/proc``).
"""

from __future__ import annotations

import argparse
import http.client
import json
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from rag_gym.data.synthhop import world_for
from rag_gym.retrieval import BM25Retriever

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def silent_client(port: int, body: bytes) -> socket.socket:
    """Send one request and read nothing; the socket stays open (a small receive buffer, so
    that the kernel does not take the reply in the client's place)."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    head = (
        "POST /retrieve HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    s.sendall(head + body)
    return s


def closed(s: socket.socket) -> bool:
    """Whether the server has closed or reset ``s``, asked without reading from it."""
    poller = select.poll()
    flags = select.POLLRDHUP | select.POLLHUP | select.POLLERR
    poller.register(s.fileno(), flags)
    return any(events & flags for _, events in poller.poll(0))


def good_client(port, queries, expected, stop, counts) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    i = 0
    while not stop.is_set():
        q = queries[i % len(queries)]
        conn.request(
            "POST", "/retrieve", json.dumps({"queries": [q], "topk": 3}),
            {"Content-Type": "application/json"},
        )  # fmt: skip
        reply = json.loads(conn.getresponse().read())
        got = [d["id"] for d in reply["result"][0]]
        counts["answered"] += 1
        counts["wrong"] += got != expected[q]
        i += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--queries", type=int, default=4096)
    parser.add_argument("--topk", type=int, default=100)
    parser.add_argument("--passages", type=int, default=3000)
    parser.add_argument("--send-timeout", type=float, default=20.0)
    parser.add_argument(
        "--wait", type=float, default=120.0, help="most seconds past --send-timeout to wait"
    )
    args = parser.parse_args()

    world = world_for("default", n_passages=args.passages, n_questions=(400, 100, 100))
    retriever = BM25Retriever(world.corpus)
    queries = [ex.question for split in world.questions.values() for ex in split]
    expected = {q: ids for q, ids in zip(queries, retriever.retrieve(queries, 3).ids, strict=True)}
    flood = [queries[i % len(queries)] + f" {i}" for i in range(args.queries)]
    body = json.dumps({"queries": flood, "topk": args.topk, "return_scores": True}).encode()
    with tempfile.TemporaryDirectory() as tmp:
        index = Path(tmp) / "bm25"
        retriever.save(index)
        port = free_port()
        code = (
            "import sys\n"
            "from rag_gym.retrieval import load_index\n"
            "from rag_gym.retrieval.server import ServerLimits, create_app, run_server\n"
            f"limits = ServerLimits(send_timeout={args.send_timeout})\n"
            f"retriever, kind = load_index({str(index)!r})\n"
            f"run_server(create_app(retriever, limits=limits), port={port}, limits=limits)\n"
        )
        proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT)
        try:
            url = f"http://127.0.0.1:{port}"
            for _ in range(600):
                try:
                    urllib.request.urlopen(url + "/health", timeout=1).read()
                    break
                except OSError:
                    time.sleep(0.1)
            req = urllib.request.Request(
                url + "/retrieve", body, {"Content-Type": "application/json"}
            )
            one = len(urllib.request.urlopen(req, timeout=300).read()) / 1e6
            before = rss_mb(proc.pid)
            stop, counts = threading.Event(), {"answered": 0, "wrong": 0}
            good = threading.Thread(
                target=good_client, args=(port, queries, expected, stop, counts), daemon=True
            )
            good.start()
            t0 = time.monotonic()
            silent = [silent_client(port, body) for _ in range(args.clients)]
            peak, open_ = before, set(range(len(silent)))
            deadline = t0 + args.send_timeout + args.wait
            while open_ and time.monotonic() < deadline:
                peak = max(peak, rss_mb(proc.pid))
                open_ -= {i for i in open_ if closed(silent[i])}
                time.sleep(0.2)
            time.sleep(1.0)
            after = rss_mb(proc.pid)
            took = time.monotonic() - t0
            dropped = len(silent) - len(open_)
            stop.set()
            good.join(30)
            for s in silent:
                s.close()
        finally:
            proc.terminate()
            proc.wait(30)
    print(f"one reply of {args.queries} queries x topk {args.topk}: {one:.1f} MB")
    print(
        f"server RSS: before {before:.0f} MB, peak with {args.clients} silent clients "
        f"{peak:.0f} MB (+{peak - before:.0f} MB; {args.clients} whole replies would be "
        f"{args.clients * one:.0f} MB), once they were disconnected {after:.0f} MB"
    )
    print(f"silent clients disconnected by the server: {dropped} of {args.clients} in {took:.0f}s")
    print(f"good replies during the flood: {counts['answered']}, wrong: {counts['wrong']}")


if __name__ == "__main__":
    main()

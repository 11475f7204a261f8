"""Stalled clients against ``rag-gym serve``: do good requests still get through?

    python benchmarks/server_stall.py --stalled 1000 --file-limit 256

Starts ``rag-gym serve`` over a small SynthHop BM25 index in a subprocess whose file-descriptor
limit is ``--file-limit``, opens ``--stalled`` connections on 127.0.0.1 (half stop in the middle
of a request head, half send a head and part of a body, then stop; all stay open on this side),
then sends ``--good`` ordinary requests one after another (10 s timeout each) while the stalled
ones are held. Prints the good requests answered correctly, the slowest of them, and how many
stalled connections the server closed within ``--head-timeout`` + ``--body-timeout`` + 5 s.
Target: every good request answered, every stalled connection closed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from rag_gym.data.synthhop import world_for
from rag_gym.retrieval import BM25Retriever


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stalled", type=int, default=1000)
    parser.add_argument("--file-limit", type=int, default=256)
    parser.add_argument("--good", type=int, default=50)
    parser.add_argument("--head-timeout", type=float, default=2.0)
    parser.add_argument("--body-timeout", type=float, default=2.0)
    args = parser.parse_args()
    # this process holds the stalled sockets: it needs descriptors for all of them
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = args.stalled + 256
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(need, hard), hard))

    world = world_for("default", n_passages=2000, n_questions=(60, 30, 30))
    retriever = BM25Retriever(world.corpus)
    queries = [q.question for q in world.questions["validation"]]
    expected = retriever.retrieve(queries, 3).ids
    tmp = Path(tempfile.mkdtemp(prefix="rag-gym-stall-"))
    retriever.save(tmp / "bm25")
    port = free_port()
    limit = args.file_limit
    cmd = [sys.executable, "-m", "rag_gym.cli", "serve", "--index", str(tmp / "bm25")]
    cmd += ["--port", str(port), "--head-timeout", str(args.head_timeout)]
    cmd += ["--body-timeout", str(args.body_timeout)]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit)),
    )
    url = f"http://127.0.0.1:{port}/retrieve"
    socks: list[socket.socket] = []
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).read()
                break
            except OSError:
                time.sleep(0.1)
        for i in range(args.stalled):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            if i % 2:
                s.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Ty")
            else:
                s.sendall(
                    b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b'Content-Length: 1000\r\n\r\n{"queries": ["a'
                )
            socks.append(s)
        ok, slowest = 0, 0.0
        for i in range(args.good):
            q = queries[i % len(queries)]
            body = json.dumps({"queries": [q], "topk": 3}).encode()
            req = urllib.request.Request(
                url, data=body, headers={"Content-Type": "application/json"}
            )
            t0 = time.perf_counter()
            try:
                with urllib.request.urlopen(req, timeout=10) as resp:
                    reply = json.loads(resp.read())
                ok += [d["id"] for d in reply["result"][0]] == expected[i % len(queries)]
            except OSError as exc:
                print(f"  good request {i} failed: {exc}")
            slowest = max(slowest, time.perf_counter() - t0)
        deadline = time.monotonic() + args.head_timeout + args.body_timeout + 5
        closed = 0
        for s in socks:
            s.settimeout(max(deadline - time.monotonic(), 0.01))
            with contextlib.suppress(OSError):
                while s.recv(4096):
                    pass
                closed += 1
        print(
            f"{args.stalled} stalled connections (half mid-head, half mid-body), server file "
            f"limit {limit}: good requests {ok}/{args.good} answered correctly, slowest "
            f"{slowest:.2f}s; stalled connections closed by the server: {closed}/{args.stalled}"
        )
    finally:
        for s in socks:
            s.close()
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    main()

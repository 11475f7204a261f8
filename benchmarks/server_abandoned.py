"""Abandoned requests against ``rag-gym serve``: do good requests keep their throughput?

    python benchmarks/server_abandoned.py --seconds 5 --flood-rate 100

Starts ``rag-gym serve`` over a SynthHop BM25 index in a subprocess on 127.0.0.1, then runs two
phases of ``--seconds`` each, measured in the same run against the same server:

* clean: ``--clients`` threads send good one-query requests (topk 3) one after another over
  keep-alive connections;
* flood: the same, while another thread sends, ``--flood-rate`` times a second (at most
  ``--flood-max`` in all), a request of ``--flood-queries`` queries at topk ``--flood-topk``
  and closes its socket as soon as the request is sent, never reading the reply (a client that
  gave up: a timed-out rollout, a killed trainer).

Prints, per phase, the good requests answered per second, their median and 99th-percentile
latency, and how many replies were wrong (every reply is compared with the in-process
ranking); then the flood phase's throughput as a share of the clean one (the mean of a clean
phase before it and one after, so that a machine whose load drifts is not read as an effect).
Target: at least 50%, no wrong reply. The same script run against a server that retrieves abandoned work shows
the drop the target rules out.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
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


def good_client(port, queries, expected, stop, latencies, wrong) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    i = 0
    while not stop.is_set():
        q = queries[i % len(queries)]
        body = json.dumps({"queries": [q], "topk": 3})
        t0 = time.perf_counter()
        try:
            conn.request("POST", "/retrieve", body, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            reply = json.loads(resp.read())
        except (OSError, http.client.HTTPException):
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            wrong.append(q)
            continue
        if not stop.is_set():
            latencies.append(time.perf_counter() - t0)
            ids = [d["id"] for d in reply.get("result", [[]])[0]]
            if resp.status != 200 or ids != expected[q]:
                wrong.append(q)
        i += 1
    conn.close()


def flood(port, body: bytes, rate: float, limit: int, stop, sent) -> None:
    head = (
        "POST /retrieve HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    start = time.perf_counter()
    while not stop.is_set() and sent.value < limit:
        due = start + sent.value / rate
        pause = due - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(head + body)  # and close at once: the client has given up
        except OSError:
            pass
        sent.value += 1


def phase(port, queries, expected, args, flood_body: bytes | None) -> dict:
    stop = threading.Event()
    latencies: list[float] = []
    wrong: list[str] = []
    sent = None
    threads = [
        threading.Thread(
            target=good_client,
            args=(port, queries[c :: args.clients], expected, stop, latencies, wrong),
        )
        for c in range(args.clients)
    ]
    flooding = None
    if flood_body is not None:  # from a process of its own: its sends take no GIL from ours
        context = multiprocessing.get_context("fork")
        flood_stop, sent = context.Event(), context.Value("i", 0)
        flooding = context.Process(
            target=flood,
            args=(port, flood_body, args.flood_rate, args.flood_max, flood_stop, sent),
        )
        flooding.start()
    for t in threads:
        t.start()
    time.sleep(args.seconds)
    stop.set()
    if flooding is not None:
        flood_stop.set()
        flooding.join(120)
    for t in threads:
        t.join(120)
    latencies.sort()
    n = len(latencies)
    return {
        "good_per_s": n / args.seconds,
        "p50_ms": 1000 * latencies[n // 2] if n else float("nan"),
        "p99_ms": 1000 * latencies[min(n - 1, int(n * 0.99))] if n else float("nan"),
        "wrong": len(wrong),
        "answered": n,
        "abandoned_sent": sent.value if sent is not None else 0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--passages", type=int, default=20_000)
    parser.add_argument("--flood-rate", type=float, default=100.0)
    parser.add_argument("--flood-max", type=int, default=2000)
    parser.add_argument("--flood-queries", type=int, default=500)
    parser.add_argument("--flood-topk", type=int, default=100)
    args = parser.parse_args()

    world = world_for("default", n_passages=args.passages, n_questions=(400, 100, 100))
    retriever = BM25Retriever(world.corpus)
    queries = [q.question for q in world.questions["train"]]
    expected = dict(zip(queries, retriever.retrieve(queries, 3).ids, strict=True))
    tmp = Path(tempfile.mkdtemp(prefix="rag-gym-abandoned-"))
    retriever.save(tmp / "bm25")
    port = free_port()
    serve = ["serve", "--index", str(tmp / "bm25"), "--port", str(port)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "rag_gym.cli", *serve],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=ROOT,
    )
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).read()
                break
            except OSError:
                if proc.poll() is not None:
                    sys.exit(f"the server exited with {proc.returncode}")
                time.sleep(0.1)
        flood_queries = [f"{queries[i % len(queries)]} {i}" for i in range(args.flood_queries)]
        body = json.dumps({"queries": flood_queries, "topk": args.flood_topk}).encode()
        phase(port, queries, expected, argparse.Namespace(**{**vars(args), "seconds": 1.0}), None)
        clean = phase(port, queries, expected, args, None)
        flooded = phase(port, queries, expected, args, body)
        after = phase(port, queries, expected, args, None)  # and the server has recovered
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    print(
        f"{args.passages} passages, {args.clients} good clients (one query, topk 3), "
        f"{args.seconds:g} s a phase; abandoned: {args.flood_queries} queries at topk "
        f"{args.flood_topk}, socket closed at once, {args.flood_rate:g}/s"
    )
    print("| phase | abandoned sent | good req/s | p50 ms | p99 ms | wrong replies |")
    print("|---|---|---|---|---|---|")
    for name, r in (("clean", clean), ("with abandoned", flooded), ("clean again", after)):
        print(
            f"| {name} | {r['abandoned_sent']} | {r['good_per_s']:.0f} | {r['p50_ms']:.1f} | "
            f"{r['p99_ms']:.1f} | {r['wrong']} |"
        )
    clean_per_s = (clean["good_per_s"] + after["good_per_s"]) / 2
    ratio = flooded["good_per_s"] / clean_per_s if clean_per_s else float("nan")
    print(f"good throughput under abandoned requests: {ratio:.0%} of clean (target >= 50%)")


if __name__ == "__main__":
    main()

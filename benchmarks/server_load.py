"""Load and throughput of the retrieval server on 127.0.0.1.

    python benchmarks/server_load.py --passages 100000 --clients 32 --requests 1000

1. Load: ``--clients`` concurrent clients send ``--requests`` single-query requests each to
   ``rag-gym serve`` (micro-batching on); prints errors (target 0), requests/s, and the server's
   resident memory at the start and the end. Bounded: it stops after ``--max-seconds``.
2. Against a one-request-at-a-time server (``--no-micro-batching``, the design of Search-R1's
   retrieval server) under the same 32 clients: throughput ratio (target >= 2).
3. Against in-process retrieval, batched: one request of ``--batch`` queries vs one
   ``retrieve`` call of the same queries (target >= 0.8).
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

from rag_gym.data.synthhop import world_for
from rag_gym.retrieval import BM25Retriever


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def start(index: str, batching: bool) -> tuple[subprocess.Popen, str]:
    port = free_port()
    args = [sys.executable, "-m", "rag_gym.cli", "serve", "--index", index, "--port", str(port)]
    if not batching:
        args.append("--no-micro-batching")
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            urllib.request.urlopen(url + "/health", timeout=1).read()
            return proc, url
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the server did not start")


def post(url: str, queries: list[str], k: int = 3) -> None:
    body = json.dumps({"queries": queries, "topk": k}).encode()
    req = urllib.request.Request(
        url + "/retrieve", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        resp.read()


def load(
    url: str, queries: list[str], clients: int, requests: int, max_seconds: float
) -> tuple[int, int, float]:
    errors, done = [0], [0]
    lock = threading.Lock()
    deadline = time.perf_counter() + max_seconds

    def client(c: int) -> None:
        for r in range(requests):
            if time.perf_counter() > deadline:
                return
            try:
                post(url, [queries[(c * requests + r) % len(queries)]])
                with lock:
                    done[0] += 1
            except Exception:
                with lock:
                    errors[0] += 1

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return done[0], errors[0], time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--passages", type=int, default=100_000)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--max-seconds", type=float, default=600)
    args = parser.parse_args()
    world = world_for("hard", n_passages=args.passages)
    queries = [s["question"] for q in world.questions["train"] for s in q.meta["decomposition"]]
    index = tempfile.mkdtemp(prefix="rag-gym-serve-") + "/bm25"
    retriever = BM25Retriever(world.corpus)
    retriever.save(index)

    proc, url = start(index, batching=True)
    rss0 = rss_mb(proc.pid)
    done, errors, seconds = load(url, queries, args.clients, args.requests, args.max_seconds)
    rss1 = rss_mb(proc.pid)
    batched_rate = done / seconds
    print(
        f"corpus {len(world.corpus):,} passages; {args.clients} clients x {args.requests} requests (1 query each)"
    )
    print(
        f"micro-batched server : {done} ok, {errors} errors in {seconds:.1f}s = {batched_rate:.1f} requests/s; "
        f"server RSS {rss0:.0f} MB at start, {rss1:.0f} MB at the end"
    )

    batch = queries[: args.batch]
    t0 = time.perf_counter()
    post(url, batch)
    served = time.perf_counter() - t0
    t0 = time.perf_counter()
    retriever.retrieve(batch, k=3)
    in_process = time.perf_counter() - t0
    proc.terminate()
    proc.wait()
    print(
        f"one request of {len(batch)} queries: server {served:.2f}s, in-process {in_process:.2f}s, "
        f"ratio {in_process / served:.2f} (target >= 0.8)"
    )

    proc, url = start(index, batching=False)
    per_client = max(1, min(args.requests, int(done / args.clients / 4) or 1))
    done1, errors1, seconds1 = load(url, queries, args.clients, per_client, args.max_seconds)
    proc.terminate()
    proc.wait()
    single_rate = done1 / seconds1
    print(
        f"one-at-a-time server : {done1} ok, {errors1} errors in {seconds1:.1f}s = {single_rate:.1f} requests/s"
    )
    print(f"micro-batched / one-at-a-time : {batched_rate / single_rate:.2f}x (target >= 2)")


if __name__ == "__main__":
    main()

"""Load and throughput of the retrieval server on 127.0.0.1.

    python benchmarks/server_load.py --passages 100000 --clients 32 --requests 1000

It builds a BM25 index over a SynthHop world, then runs four things; each server runs in its
own process, started and stopped here, one at a time:

1. Load: ``--clients`` concurrent clients (one keep-alive connection each) send ``--requests``
   single-query requests each (Search-R1's ``/retrieve`` body, ``topk`` 3, scores on) to
   ``rag-gym serve`` (micro-batching on). Prints ok and failed requests (target: 0 failed),
   requests/s, and the server's resident memory at the start, the peak during the load and the
   end. Bounded: the clients stop at ``--max-seconds``, and every request times out after 60 s.
2. Against a one-request-at-a-time server under the same clients (``--compare-requests`` each;
   target >= 2x): a FastAPI server of Search-R1's design (``retrieval_server.py``: a
   synchronous endpoint that FastAPI runs in its thread pool, each request retrieved on its
   own, the reply encoded by FastAPI) over the same retriever and index, and, with
   ``--against REV``, ``rag-gym serve`` with git revision ``REV``'s ``rag_gym`` (for reference).
   Our server is measured again with the same request count, in rounds interleaved with them.
3. Against in-process retrieval, batched: one request of ``--batch`` queries on a keep-alive
   connection (sent to reply parsed, with the parser ``HttpRetriever`` uses: orjson when
   installed) against one ``retrieve`` call of the same queries in this process (best of
   ``--repeats``; target >= 0.8), and against ``retrieve`` plus reading the passage texts,
   which is what the server's reply holds.
4. The single-query form ``{"query": ..., "topk": 3}`` (SkyRL-gym, rLLM)
   against the batched form with one query, same server and clients, in ``--rounds``
   interleaved rounds; target: the same throughput (ratio >= 0.95).
   ``--query-form-only`` runs this comparison alone.

Another process loading the CPU changes the figures; the ratios compare runs made minutes apart.
"""

# no "from __future__ import annotations": FastAPI must see the request model class itself

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from revisions import extract_revision, package_env

from rag_gym.data.synthhop import world_for
from rag_gym.retrieval import BM25Retriever
from rag_gym.retrieval.server import loads  # what HttpRetriever parses replies with

HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


# ---- a server of Search-R1's design, over our retriever -------------------------------------
def search_r1_style_app(retriever):
    """Search-R1's ``search_r1/search/retrieval_server.py`` endpoint, over ``retriever``: a
    pydantic ``QueryRequest``, a synchronous ``def`` endpoint (FastAPI runs it in its thread
    pool), the request's queries retrieved on their own, and the reply dict encoded by FastAPI."""
    from fastapi import FastAPI
    from pydantic import BaseModel

    class QueryRequest(BaseModel):
        queries: list[str]
        topk: int | None = None
        return_scores: bool = False

    app = FastAPI()
    corpus = retriever.corpus

    @app.get("/health")
    def health():
        return {"status": "ok", "corpus_size": len(corpus)}

    @app.post("/retrieve")
    def retrieve_endpoint(request: QueryRequest):
        topk = request.topk or 3
        found = retriever.retrieve(request.queries, topk)
        resp = []
        for ids, scores in zip(found.ids, found.scores, strict=True):
            docs = [{"id": pid, "contents": corpus[pid].contents} for pid in ids]
            if request.return_scores:
                resp.append(
                    [{"document": d, "score": s} for d, s in zip(docs, scores, strict=True)]
                )
            else:
                resp.append(docs)
        return {"result": resp}

    return app


def serve_search_r1_style(index: str, port: int) -> None:
    import uvicorn

    uvicorn.run(
        search_r1_style_app(BM25Retriever.load(index)), host=HOST, port=port, log_level="warning"
    )


def start(kind: str, index: str, package: Path | None = None) -> tuple[subprocess.Popen, int]:
    """A server of ``kind`` on ``index`` in a process of its own (``rag-gym serve`` of the
    ``rag_gym`` in ``package`` when given), once it answers."""
    port = free_port()
    if kind == "search-r1":
        args = [sys.executable, __file__, "--serve-search-r1", index, "--port", str(port)]
    else:
        args = [sys.executable, "-m", "rag_gym.cli", "serve", "--index", index]
        args += ["--port", str(port)]
    proc = subprocess.Popen(
        args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=package_env(package)
    )
    for _ in range(1200):
        try:
            urllib.request.urlopen(f"http://{HOST}:{port}/health", timeout=1).read()
            return proc, port
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"the {kind} server exited: {proc.stderr.read().decode()[-800:]}"
                ) from None
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"the {kind} server did not start within 120 s")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# ---- the load: keep-alive clients on asyncio ------------------------------------------------
async def one_request(reader, writer, body: bytes) -> bytes:
    writer.write(
        b"POST /retrieve HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    status = int((await reader.readline()).split()[1])
    length = 0
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    payload = await reader.readexactly(length)
    if status != 200:
        raise ValueError(f"status {status}: {payload[:200]!r}")
    return payload


async def run_load(
    port: int, pid: int, bodies: list[bytes], clients: int, requests: int, max_seconds: float
) -> dict:
    stats = {"ok": 0, "failed": 0, "errors": []}
    rss = [rss_mb(pid)]
    deadline = time.perf_counter() + max_seconds
    stopped = asyncio.Event()

    async def sample() -> None:
        while not stopped.is_set():
            rss.append(rss_mb(pid))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopped.wait(), 0.5)

    async def client(c: int) -> None:
        reader = writer = None
        for r in range(requests):
            if time.perf_counter() > deadline:
                return
            try:
                if writer is None:
                    reader, writer = await asyncio.open_connection(HOST, port)
                payload = await asyncio.wait_for(
                    one_request(reader, writer, bodies[(c * requests + r) % len(bodies)]), 60
                )
                reply = loads(payload)["result"]
                if len(reply) != 1 or len(reply[0]) != 3:
                    raise ValueError(f"expected 1 result of 3 passages, got {reply!r:.200}")
                stats["ok"] += 1
            except (OSError, ValueError, KeyError, TimeoutError, asyncio.IncompleteReadError) as e:
                stats["failed"] += 1
                stats["errors"].append(f"{type(e).__name__}: {e}")
                if writer is not None:
                    writer.close()
                reader = writer = None
        if writer is not None:
            writer.close()

    sampler = asyncio.create_task(sample())
    t0, cpu0, own0 = time.perf_counter(), cpu_seconds(pid), time.process_time()
    await asyncio.gather(*(client(c) for c in range(clients)))
    stats["seconds"] = time.perf_counter() - t0
    stats["server_cpu"] = cpu_seconds(pid) - cpu0
    stats["client_cpu"] = time.process_time() - own0
    stopped.set()
    await sampler
    rss.append(rss_mb(pid))
    stats.update(rss_start=rss[0], rss_peak=max(rss), rss_end=rss[-1])
    stats["rate"] = stats["ok"] / stats["seconds"]
    return stats


def warm_up(port: int, pid: int, bodies: list[bytes]) -> None:
    """A few requests outside the timed runs (first-request code paths, page cache)."""
    asyncio.run(run_load(port, pid, bodies[-64:], 8, 8, 60))


async def time_batched(port: int, body: bytes, repeats: int, *in_process) -> list[float]:
    """Best time of one request of ``body`` on a keep-alive connection, and of each in-process
    function, timed alternately."""
    reader, writer = await asyncio.open_connection(HOST, port)
    try:
        loads(await one_request(reader, writer, body))  # warm-up
        best = [float("inf")] * (1 + len(in_process))
        for _ in range(repeats):
            t0 = time.perf_counter()
            loads(await one_request(reader, writer, body))
            best[0] = min(best[0], time.perf_counter() - t0)
            for i, fn in enumerate(in_process, 1):
                t0 = time.perf_counter()
                fn()
                best[i] = min(best[i], time.perf_counter() - t0)
        return best
    finally:
        writer.close()


def compare_query_forms(server: tuple[subprocess.Popen, int], queries: list[str], args) -> int:
    """Throughput of ``{"query": q}`` against ``{"queries": [q]}`` on one server, rounds
    interleaved; returns the failed requests."""
    proc, port = server
    forms = {
        "queries": [
            json.dumps({"queries": [q], "topk": 3, "return_scores": True}).encode() for q in queries
        ],
        "query": [
            json.dumps({"query": q, "topk": 3, "return_scores": True}).encode() for q in queries
        ],
    }
    totals = {form: {"ok": 0, "failed": 0, "seconds": 0.0} for form in forms}
    per_round = max(1, args.compare_requests // args.rounds)
    order = list(forms)
    for r in range(args.rounds):
        for form in order[r % 2 :] + order[: r % 2]:
            s = asyncio.run(
                run_load(port, proc.pid, forms[form], args.clients, per_round, args.max_seconds)
            )
            for key in totals[form]:
                totals[form][key] += s[key]
            for error in s["errors"][:3]:
                print(f"  {form} form failed: {error}")
    rates = {form: t["ok"] / t["seconds"] for form, t in totals.items()}
    for form, t in totals.items():
        print(
            f"{form!r:>10} form: {args.clients} clients x {per_round * args.rounds} requests in "
            f"{args.rounds} interleaved rounds: {t['ok']} ok, {t['failed']} failed, "
            f"{rates[form]:.0f} requests/s"
        )
    ratio = rates["query"] / rates["queries"]
    print(
        f"single-query form / batched form of one query: {ratio:.2f} (target >= 0.95: the same "
        f"throughput): {'MET' if ratio >= 0.95 else 'MISSED'}"
    )
    return sum(t["failed"] for t in totals.values())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--passages", type=int, default=100_000)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--requests", type=int, default=1000, help="per client, load run")
    parser.add_argument(
        "--compare-requests", type=int, default=300, help="per client and server, comparison"
    )
    parser.add_argument("--rounds", type=int, default=3, help="interleaved comparison rounds")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-seconds", type=float, default=600)
    parser.add_argument(
        "--query-form-only", action="store_true", help="only compare query with queries (4)"
    )
    parser.add_argument(
        "--against", metavar="REV", help="also compare with rag-gym serve of git revision REV"
    )
    parser.add_argument("--serve-search-r1", metavar="INDEX", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_search_r1:
        serve_search_r1_style(args.serve_search_r1, args.port)
        return

    world = world_for("hard", n_passages=args.passages)
    queries = [s["question"] for q in world.questions["train"] for s in q.meta["decomposition"]]
    bodies = [
        json.dumps({"queries": [q], "topk": 3, "return_scores": True}).encode() for q in queries
    ]
    tmp = Path(tempfile.mkdtemp(prefix="rag-gym-serve-"))
    servers: dict[str, tuple[subprocess.Popen, int]] = {}
    try:
        retriever = BM25Retriever(world.corpus)
        retriever.save(tmp / "bm25")
        index = str(tmp / "bm25")
        print(
            f"corpus {len(world.corpus):,} passages (SynthHop 'hard'); BM25 backend "
            f"{retriever.backend}; {len(queries):,} distinct sub-questions as queries"
        )
        kinds = ("batched", "search-r1", *(["against"] if args.against else []))
        package = extract_revision(args.against, tmp / "against") if args.against else None
        for kind in kinds[:1] if args.query_form_only else kinds:  # all stay up, idle if unused
            servers[kind] = start(kind, index, package if kind == "against" else None)
            warm_up(servers[kind][1], servers[kind][0].pid, bodies)
        if args.query_form_only:
            compare_query_forms(servers["batched"], queries, args)
            return

        # 1. load
        proc, port = servers["batched"]
        s = asyncio.run(
            run_load(port, proc.pid, bodies, args.clients, args.requests, args.max_seconds)
        )
        print(
            f"load: micro-batched server, {args.clients} clients x {args.requests} requests "
            f"(1 query each): {s['ok']} ok, {s['failed']} failed in {s['seconds']:.1f}s = "
            f"{s['rate']:.0f} requests/s; server RSS {s['rss_start']:.0f} MB at the start, "
            f"peak {s['rss_peak']:.0f} MB, {s['rss_end']:.0f} MB at the end"
        )
        for error in s["errors"][:5]:
            print(f"  failed: {error}")
        failed_total = s["failed"]

        # 2. against one-request-at-a-time servers: same clients, rounds interleaved so that a
        # change in the machine's load falls on every server alike
        totals = {
            kind: dict.fromkeys(("ok", "failed", "seconds", "server", "client"), 0.0)
            for kind in kinds
        }
        per_round = max(1, args.compare_requests // args.rounds)
        for r in range(args.rounds):
            for kind in kinds[r % len(kinds) :] + kinds[: r % len(kinds)]:
                proc, port = servers[kind]
                s = asyncio.run(
                    run_load(port, proc.pid, bodies, args.clients, per_round, args.max_seconds)
                )
                for key, value in (
                    ("ok", s["ok"]),
                    ("failed", s["failed"]),
                    ("seconds", s["seconds"]),
                    ("server", s["server_cpu"]),
                    ("client", s["client_cpu"]),
                ):
                    totals[kind][key] += value
                for error in s["errors"][:3]:
                    print(f"  {kind} failed: {error}")
        rates, label = {}, {"against": args.against}
        for kind in kinds:
            t = totals[kind]
            rates[kind] = t["ok"] / t["seconds"]
            failed_total += int(t["failed"])
            print(
                f"{label.get(kind, kind):>10} server: {args.clients} clients x "
                f"{per_round * args.rounds} requests "
                f"in {args.rounds} interleaved rounds: {int(t['ok'])} ok, {int(t['failed'])} failed, "
                f"{rates[kind]:.0f} requests/s; CPU per request: server "
                f"{t['server'] / max(t['ok'], 1) * 1e3:.2f} ms, clients "
                f"{t['client'] / max(t['ok'], 1) * 1e3:.2f} ms"
            )
        ratio = rates["batched"] / rates["search-r1"]
        print(
            f"micro-batched / Search-R1-design one-at-a-time : {ratio:.2f}x (target >= 2): "
            f"{'MET' if ratio >= 2 else 'MISSED'}"
        )
        if args.against:
            print(
                f"this tree / rag-gym serve at {args.against} : "
                f"{rates['batched'] / rates['against']:.2f}x (reference, no target)"
            )

        # 3. one batched request against in-process retrieval of the same queries
        batch = queries[: args.batch]
        body = json.dumps({"queries": batch, "topk": 3, "return_scores": True}).encode()
        corpus = world.corpus

        def with_texts() -> None:  # what the server returns: ids, scores and passage texts
            found = retriever.retrieve(batch, k=3)
            [[corpus[pid].contents for pid in ids] for ids in found.ids]

        served, in_process, in_process_texts = asyncio.run(
            time_batched(
                servers["batched"][1],
                body,
                args.repeats,
                lambda: retriever.retrieve(batch, k=3),
                with_texts,
            )
        )
        ratio = in_process / served
        print(
            f"one request of {len(batch)} queries (keep-alive), best of {args.repeats}: server "
            f"{served * 1e3:.1f} ms (request sent to reply parsed), in-process retrieve "
            f"{in_process * 1e3:.1f} ms, in-process retrieve + passage texts "
            f"{in_process_texts * 1e3:.1f} ms; server throughput / in-process {ratio:.2f} "
            f"(target >= 0.8): {'MET' if ratio >= 0.8 else 'MISSED'}; against retrieve + "
            f"texts {in_process_texts / served:.2f}"
        )
        failed_total += compare_query_forms(servers["batched"], queries, args)
        print(f"failed requests in all runs: {failed_total} (target 0)")
    finally:
        for proc, _ in servers.values():
            stop(proc)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

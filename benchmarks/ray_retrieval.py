"""Sharded retrieval on a Ray cluster against one index in-process, all measured in one run.

    python benchmarks/ray_retrieval.py --passages 100000 --queries 4096 --batch 512

Starts a Ray cluster on 127.0.0.1 (a head and two worker nodes, ``ray.cluster_utils.Cluster``),
builds a BM25 index of a SynthHop world of ``--passages`` passages and a sharded copy of it,
and measures, on the same queries (the world's questions and sub-questions, repeated):

1. **Ray overhead**: batched q/s of ``RayShardedRetriever`` with one shard and one replica
   against ``BM25Retriever.retrieve`` in this process (what ``rag-gym serve`` calls), batches
   of ``--batch`` queries, top 3. Then the same two behind ``rag-gym serve``'s app (uvicorn on
   127.0.0.1, in a thread here), each batch one ``/retrieve`` request from ``HttpRetriever``:
   what a client sees. Target >= 0.8.
2. **Replicas**: q/s with 1 and with 2 replicas of one shard, ``--clients`` threads each sending
   batches; on 2 cores the second replica competes with the first and the router for the same
   cores, which bounds the gain.
3. **Shards**: q/s with 1, 2 and 3 shards (one replica each), and that every answer equals the
   single index's.
4. The inputs of the capacity model in docs/scale-out.md: bytes per passage of the BM25 index
   folder; and FAISS's speed on ``--dense-n`` random 768-dimensional vectors (e5-base's size),
   flat in float32 and float16 and IVF-PQ (``--nlist`` lists, 64-byte codes, ``--nprobe``),
   batches of ``--batch``; then the model itself for 21M passages on machines of 24 GiB.

Every figure comes from this run; on a machine shared with other work they are lower bounds.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from pathlib import Path


def rate(fn, queries: list[str], batch: int, rounds: int) -> float:
    """Best q/s over ``rounds`` passes of ``fn`` over ``queries`` in batches of ``batch``."""
    best = 0.0
    for _ in range(rounds):
        t0 = time.perf_counter()
        for i in range(0, len(queries), batch):
            fn(queries[i : i + batch])
        best = max(best, len(queries) / (time.perf_counter() - t0))
    return best


def concurrent_rate(fn, queries: list[str], batch: int, clients: int) -> float:
    """q/s with ``clients`` threads each sending its share of ``queries`` in batches."""
    shares = [queries[c::clients] for c in range(clients)]

    def run(share):
        for i in range(0, len(share), batch):
            fn(share[i : i + batch])

    threads = [threading.Thread(target=run, args=(s,)) for s in shares]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return len(queries) / (time.perf_counter() - t0)


def http_rate(retriever, queries: list[str], batch: int, rounds: int) -> float:
    """``rate`` of ``retriever`` behind ``rag-gym serve``'s app on 127.0.0.1 (uvicorn in a
    thread of this process), each batch one request from ``HttpRetriever``."""
    import socket

    from rag_gym.retrieval.http import HttpRetriever
    from rag_gym.retrieval.server import create_app, make_server

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = make_server(create_app(retriever, kind="bm25"), "127.0.0.1", port)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    try:
        client = HttpRetriever(f"http://127.0.0.1:{port}", timeout=600)
        client.retrieve(queries[:batch], 3)  # warm
        return rate(lambda q: client.retrieve(q, 3), queries, batch, rounds)
    finally:
        server.should_exit = True
        thread.join()


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--passages", type=int, default=100_000)
    ap.add_argument("--queries", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dense-n", type=int, default=200_000)
    ap.add_argument("--nlist", type=int, default=1024)
    ap.add_argument("--nprobe", type=int, default=16)
    ap.add_argument("--skip-ray", action="store_true", help="only the dense figures and the model")
    args = ap.parse_args()
    dense = dense_speeds(args)
    if args.skip_ray:
        capacity(dense, None)
        return

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # every node and this driver on 127.0.0.1 (Ray otherwise advertises the external address)
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray
    from ray.cluster_utils import Cluster

    from rag_gym.data.synthhop import world_for
    from rag_gym.data.types import iter_corpus_jsonl
    from rag_gym.retrieval.bm25 import BM25Retriever
    from rag_gym.retrieval.bm25_build import build_bm25_index
    from rag_gym.retrieval.ray_shards import RayShardedRetriever
    from rag_gym.retrieval.shards import build_bm25_shards

    work = Path(tempfile.mkdtemp(prefix="ray-retrieval-"))
    t0 = time.perf_counter()
    world = world_for("default", n_passages=args.passages)
    corpus = work / "corpus.jsonl"
    world.corpus.to_jsonl(corpus)
    base = [ex.question for split in world.questions.values() for ex in split]
    base += [d["question"] for split in world.questions.values() for ex in split
             for d in ex.meta.get("decomposition", [])]  # fmt: skip
    queries = (base * (args.queries // len(base) + 1))[: args.queries]
    one = BM25Retriever.load(
        build_bm25_index((p for _, p in iter_corpus_jsonl(corpus)), work / "one")
    )
    print(f"world of {len(one.corpus):,} passages and its index in {time.perf_counter() - t0:.0f}s")

    node = {"num_cpus": 2, "object_store_memory": 200 << 20}
    cluster = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
    for _ in range(2):
        cluster.add_node(**node)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
    try:
        local = rate(lambda q: one.retrieve(q, 3), queries, args.batch, args.rounds)
        print(f"\nin-process BM25Retriever, batches of {args.batch}: {local:,.0f} q/s")

        s1 = build_bm25_shards(corpus, work / "s1", 1)
        router = RayShardedRetriever(s1, replicas=1, cpus_per_replica=0.5)
        router.retrieve(queries[: args.batch], 3)  # warm
        remote = rate(lambda q: router.retrieve(q, 3), queries, args.batch, args.rounds)
        print(
            f"Ray, 1 shard x 1 replica: {remote:,.0f} q/s -> ratio {remote / local:.3f} (target >= 0.8)"
        )
        c1 = concurrent_rate(lambda q: router.retrieve(q, 3), queries, args.batch, args.clients)
        served_local = http_rate(one, queries, args.batch, args.rounds)
        served_ray = http_rate(router, queries, args.batch, args.rounds)
        print(
            f"behind rag-gym serve (HTTP, batches of {args.batch}): in-process "
            f"{served_local:,.0f} q/s, Ray 1 x 1 {served_ray:,.0f} q/s -> ratio "
            f"{served_ray / served_local:.3f} (target >= 0.8)"
        )
        router.shutdown()

        router = RayShardedRetriever(s1, replicas=2, cpus_per_replica=0.5)
        router.retrieve(queries[: args.batch], 3)
        c2 = concurrent_rate(lambda q: router.retrieve(q, 3), queries, args.batch, args.clients)
        router.shutdown()
        print(
            f"{args.clients} clients: 1 replica {c1:,.0f} q/s, 2 replicas {c2:,.0f} q/s -> "
            f"{c2 / c1:.2f}x (2 cores: the replicas, the router and the clients share them)"
        )

        want = one.retrieve(queries, 3)
        for s in (1, 2, 3):
            out = s1 if s == 1 else build_bm25_shards(corpus, work / f"s{s}", s)
            router = RayShardedRetriever(out, replicas=1, cpus_per_replica=0.5)
            router.retrieve(queries[: args.batch], 3)
            got = router.retrieve(queries, 3)
            same = got.ids == want.ids and got.scores == want.scores
            q = rate(lambda q, r=router: r.retrieve(q, 3), queries, args.batch, 1)
            router.shutdown()
            print(f"{s} shard(s): {q:,.0f} q/s, top-3 identical to one index: {same}")

        n = len(one.corpus)
        print(
            f"\nindex folder: {folder_bytes(work / 'one') / n:.0f} bytes a passage "
            f"({folder_bytes(work / 'one') / 1e9:.3f} GB for {n:,})"
        )
        capacity(dense, folder_bytes(work / "one") / n)
    finally:
        ray.shutdown()
        cluster.shutdown()


def dense_speeds(args) -> dict[str, tuple[float, float]]:
    """FAISS q/s and bytes a vector on ``--dense-n`` random unit vectors of 768 dimensions:
    ``{name: (q/s, bytes)}`` for flat float32, flat float16 and IVF-PQ."""
    import faiss
    import numpy as np

    rng = np.random.default_rng(0)
    d, n = 768, args.dense_n
    xb = rng.standard_normal((n, d), dtype=np.float32)
    xb /= np.linalg.norm(xb, axis=1, keepdims=True)
    xq = xb[rng.integers(0, n, args.batch)] + 0.1 * rng.standard_normal(
        (args.batch, d), dtype=np.float32
    )
    out = {}
    flat = faiss.IndexFlatIP(d)
    flat.add(xb)
    fp16 = faiss.IndexScalarQuantizer(d, faiss.ScalarQuantizer.QT_fp16, faiss.METRIC_INNER_PRODUCT)
    fp16.train(xb[:10_000])
    fp16.add(xb)
    ivfpq = faiss.IndexIVFPQ(faiss.IndexFlatIP(d), d, args.nlist, 64, 8, faiss.METRIC_INNER_PRODUCT)
    t0 = time.perf_counter()
    ivfpq.train(xb[: min(n, 100 * args.nlist)])
    ivfpq.add(xb)
    ivfpq.nprobe = args.nprobe
    train = time.perf_counter() - t0
    for name, index, size in (
        ("flat fp32", flat, 4 * d),
        ("flat fp16", fp16, 2 * d),
        (f"IVF-PQ 64 B, nprobe {args.nprobe}/{args.nlist}", ivfpq, 64 + 8),
    ):
        index.search(xq[:8], 3)
        t0 = time.perf_counter()
        index.search(xq, 3)
        out[name] = (args.batch / (time.perf_counter() - t0), size)
    print(
        f"\nFAISS on {n:,} random 768-d vectors, batches of {args.batch} (IVF-PQ trained and filled in {train:.0f}s):"
    )
    for name, (qps, size) in out.items():
        print(f"  {name}: {qps:,.0f} q/s, {size} bytes a vector")
    out["_n"] = (float(n), 0.0)
    return out


def capacity(dense: dict, bm25_bytes: float | None) -> None:
    """The capacity model for 21M passages on machines of 24 GiB (18 GiB for the index): the
    shards each needs, and the q/s expected when a shard's search time grows with its size."""
    n_meas = dense["_n"][0]
    total, usable = 21_000_000, 18 * 2**30
    print("\ncapacity model, 21M passages, machines of 24 GiB (18 GiB for the index):")
    rows = [(k, v) for k, v in dense.items() if not k.startswith("_")]
    if bm25_bytes is not None:
        print(f"  BM25: {bm25_bytes * total / 1e9:.1f} GB on disk at {bm25_bytes:.0f} B a passage")
    for name, (qps, size) in rows:
        mem = total * size
        shards = max(1, -(-mem // usable))
        per_shard = total / shards
        # a shard's search time grows with the vectors it scans (IVF: the same fraction)
        expected = qps * n_meas / per_shard
        print(
            f"  {name}: {mem / 2**30:.1f} GiB in all -> {shards} shard(s) of "
            f"{mem / shards / 2**30:.1f} GiB, about {expected:,.1f} q/s a batch (shards in parallel)"
        )


if __name__ == "__main__":
    main()

"""Retrieval at scale: BM25, dense and hybrid over SynthHop corpora, against the raw libraries.

    python benchmarks/retrieval_sweep.py                       # 10k, 100k and 1M passages
    python benchmarks/retrieval_sweep.py --sizes 10000 --dense-max 10000

For each corpus size (a SynthHop "hard" world of that many passages) and each retriever, in a
fresh process so that memory figures do not mix:

* build time (for BM25 it includes compiling the numba kernels, or loading them from numba's
  cache), resident memory (RSS) of the process after the build, and the growth the build caused;
* batched throughput (one ``retrieve`` call over ``--queries`` queries, k=3, best of
  ``--repeats``) and single-query throughput (``--single`` calls of one query each);
* rag-gym's wrapper against the raw library on the same queries, timed alternately, best of
  ``--repeats``: ``BM25Retriever`` against bm25s itself (tokenise + ``BM25.retrieve``, numba
  backend on all cores: its fastest setting), and ``DenseRetriever`` against
  sentence-transformers ``encode`` + the FAISS ``search`` of the same index (target <= 1.1x);
  the raw libraries' JIT warm-ups happen before timing, on both sides;
* rank_bm25 (``BM25Okapi``, the slower choice users often make) on the same corpus tokens, on
  sizes up to ``--rank-bm25-max`` with ``--rank-bm25-queries`` queries;
* for BM25, the resident memory of a fresh process that loads the saved index (what a server
  holds: corpus, arrays, runtime).

Dense encoding of passages runs at tens of passages per second on 2 CPU cores, so dense and
hybrid run only on sizes up to ``--dense-max``; larger cells print "skipped" with the reason and
the time they would take at the measured rate. Targets print MET or MISSED at the end. Other
processes on the machine slow everything down; ratios are measured within one process, timed
alternately, and the load average is printed at the start and the end.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import resource
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
from revisions import run_step

GB = 1024**3


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def mb(n: float) -> str:
    return f"{n / 1024**2:,.0f} MB"


def world_and_queries(n: int):
    from rag_gym.data.synthhop import world_for

    # the preset's 1,400 questions need 5,600 passages; smaller (smoke-test) worlds ask fewer
    small = {} if n >= 5_600 else {"n_questions": (n // 8, n // 32, n // 32)}
    world = world_for("hard", n_passages=n, **small)
    queries: list[str] = []
    for split in ("train", "validation", "test"):
        for q in world.questions[split]:
            queries.append(q.question)
            queries.extend(step["question"] for step in q.meta["decomposition"])
    return world, queries


def best_of(repeats: int, *fns) -> list[float]:
    """Time each function ``repeats`` times, alternating between them; best time of each."""
    best = [float("inf")] * len(fns)
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - t0)
    return best


def single_rate(retrieve, queries: list[str], k: int) -> float:
    t0 = time.perf_counter()
    for q in queries:
        retrieve([q], k)
    return len(queries) / (time.perf_counter() - t0)


# ---- cells, each run in its own process ------------------------------------------------------
def cell_bm25(args, out: dict) -> None:
    import bm25s
    import Stemmer

    from rag_gym.retrieval import BM25Retriever

    n, k = args.size, args.k
    t0 = time.perf_counter()
    world, queries = world_and_queries(n)
    rss0 = rss_bytes()
    print(f"  world: {len(world.corpus):,} passages generated in {time.perf_counter() - t0:.1f}s")
    t0 = time.perf_counter()
    ours = BM25Retriever(world.corpus)
    build = time.perf_counter() - t0
    rss1 = rss_bytes()
    arrays = sum(ours.model.scores[key].nbytes for key in ("data", "indices", "indptr"))
    print(
        f"  bm25 build {build:.1f}s (backend {ours.backend}, {ours.n_threads} threads); RSS "
        f"{mb(rss1)} (+{mb(rss1 - rss0)} for the index, score arrays {mb(arrays)}), "
        f"peak {mb(peak_rss_bytes())}"
    )
    batch = queries[: args.queries]
    single = queries[: args.single]
    ours.retrieve(batch[:8], k)  # first-call paths (the kernels are compiled at build)
    (t_ours,) = best_of(args.repeats, lambda: ours.retrieve(batch, k))
    rate = len(batch) / t_ours
    single_ours = single_rate(ours.retrieve, single, k)
    print(
        f"  bm25 batched {rate:,.0f} q/s ({len(batch)} queries, k={k}); single-query "
        f"{single_ours:,.0f} q/s ({len(single)} calls)"
    )
    out["bm25"] = {
        "build_s": build,
        "rss": rss1,
        "rss_growth": rss1 - rss0,
        "batched_qps": rate,
        "single_qps": single_ours,
    }

    # raw bm25s on the same index arrays: its numba backend on every core (its fastest setting)
    stemmer = Stemmer.Stemmer("english")
    raw = copy.copy(ours.model)
    raw.backend = "numba"
    import numba

    # bm25s sets numba's thread count, which NUMBA_NUM_THREADS caps
    threads = min(len(os.sched_getaffinity(0)), numba.config.NUMBA_NUM_THREADS)

    def raw_retrieve(qs: list[str], kk: int, n_threads: int = threads):
        tokens = bm25s.tokenize(qs, stopwords="en", stemmer=stemmer, show_progress=False)
        return raw.retrieve(tokens, k=kk, n_threads=n_threads, show_progress=False)

    def raw_single(qs: list[str], kk: int):  # one thread: bm25s's fastest for one query
        return raw_retrieve(qs, kk, n_threads=1)

    raw_retrieve(batch[:8], k)  # bm25s compiles its numba functions on the first calls
    raw_single(batch[:1], k)
    t_ours, t_raw = best_of(
        args.repeats, lambda: ours.retrieve(batch, k), lambda: raw_retrieve(batch, k)
    )
    ratio = t_ours / t_raw
    single_raw = single_rate(raw_single, single, k)
    single_ours = single_rate(ours.retrieve, single, k)
    print(
        f"  wrapper vs raw bm25s (numba, n_threads={threads}), same queries: batched rag-gym "
        f"{len(batch) / t_ours:,.0f} q/s, bm25s {len(batch) / t_raw:,.0f} q/s, time ratio "
        f"{ratio:.2f} (target <= 1.1); single-query rag-gym {single_ours:,.0f} q/s, bm25s "
        f"(n_threads=1) {single_raw:,.0f} q/s, time ratio {single_raw / single_ours:.2f}"
    )
    out["bm25"]["raw_ratio"] = ratio
    out["bm25"]["raw_single_ratio"] = single_raw / single_ours

    # the numpy backends, for reference (the fallback without numba)
    few = batch[: args.numpy_queries]
    numpy_ours = BM25Retriever(backend="numpy")
    numpy_ours._install(ours.model, ours.corpus)
    raw_np = copy.copy(ours.model)
    raw_np.backend = "numpy"

    def raw_np_retrieve(qs, kk):
        tokens = bm25s.tokenize(qs, stopwords="en", stemmer=stemmer, show_progress=False)
        return raw_np.retrieve(tokens, k=kk, show_progress=False)

    t_np, t_raw_np = best_of(
        1, lambda: numpy_ours.retrieve(few, k), lambda: raw_np_retrieve(few, k)
    )
    print(
        f"  numpy backends ({len(few)} queries): rag-gym {len(few) / t_np:,.0f} q/s, raw bm25s "
        f"{len(few) / t_raw_np:,.0f} q/s"
    )

    # rank_bm25 on the same tokens
    if n <= args.rank_bm25_max:
        try:
            from rank_bm25 import BM25Okapi
        except ImportError:
            print("  rank_bm25: skipped: not installed (pip install 'rag-gym[bench]')")
        else:
            tokens = ours.tokenize(world.corpus.contents())
            t0 = time.perf_counter()
            okapi = BM25Okapi(tokens)
            okapi_build = time.perf_counter() - t0
            few = batch[: args.rank_bm25_queries]
            few_tokens = ours.tokenize(few)
            t0 = time.perf_counter()
            for toks in few_tokens:
                scores = okapi.get_scores(toks)
                np.argpartition(scores, len(scores) - k)[-k:]
            okapi_rate = len(few) / (time.perf_counter() - t0)
            print(
                f"  rank_bm25 BM25Okapi, same corpus and tokens: build {okapi_build:.1f}s, "
                f"{okapi_rate:,.1f} q/s ({len(few)} queries, one at a time as its API "
                f"scores); rag-gym batched is {rate / okapi_rate:,.0f}x faster"
            )
            out["bm25"]["rank_bm25_qps"] = okapi_rate
    else:
        print(
            f"  rank_bm25: skipped: {n:,} passages is over --rank-bm25-max {args.rank_bm25_max:,}"
        )
    if args.save:
        ours.save(args.save)


def cell_bm25_load(args, out: dict) -> None:
    from rag_gym.retrieval import BM25Retriever

    rss0 = rss_bytes()
    t0 = time.perf_counter()
    loaded = BM25Retriever.load(args.save)
    seconds = time.perf_counter() - t0
    loaded.retrieve(["who founded the guild"], k=3)
    rss1 = rss_bytes()
    print(
        f"  bm25 index loaded by a fresh process in {seconds:.1f}s: process RSS {mb(rss1)} "
        f"(runtime {mb(rss0)} before loading)"
    )
    out["bm25_load"] = {"rss": rss1, "load_s": seconds}


def cell_dense(args, out: dict) -> None:
    from rag_gym.retrieval import BM25Retriever, HybridRetriever
    from rag_gym.retrieval.dense import DenseRetriever
    from rag_gym.retrieval.encoders import default_encoder

    n, k = args.size, args.k
    world, queries = world_and_queries(n)
    encoder = default_encoder()
    rss0 = rss_bytes()
    t0 = time.perf_counter()
    dense = DenseRetriever(world.corpus, encoder=encoder)
    build = time.perf_counter() - t0
    rss1 = rss_bytes()
    encode_rate = len(world.corpus) / build
    print(
        f"  dense build {build:.1f}s ({encode_rate:,.0f} passages/s, all-MiniLM-L6-v2, FAISS "
        f"flat); RSS {mb(rss1)} (+{mb(rss1 - rss0)})"
    )
    batch = queries[: args.dense_queries]
    single = queries[: args.dense_single]
    dense.retrieve(batch[:4], k)
    (t_dense,) = best_of(args.repeats, lambda: dense.retrieve(batch, k))
    single_dense = single_rate(dense.retrieve, single, k)
    print(
        f"  dense batched {len(batch) / t_dense:,.1f} q/s ({len(batch)} queries); single-query "
        f"{single_dense:,.1f} q/s ({len(single)} calls)"
    )

    model = encoder._model
    index = dense._index

    def raw_dense(qs, kk):
        emb = model.encode(
            qs,
            batch_size=encoder.batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return index.search(emb.astype(np.float32), kk)

    t_ours, t_raw = best_of(
        args.repeats, lambda: dense.retrieve(batch, k), lambda: raw_dense(batch, k)
    )
    ratio = t_ours / t_raw
    print(
        f"  wrapper vs raw sentence-transformers + FAISS, same queries and index: rag-gym "
        f"{len(batch) / t_ours:,.1f} q/s, raw {len(batch) / t_raw:,.1f} q/s, time ratio "
        f"{ratio:.2f} (target <= 1.1)"
    )
    out["dense"] = {
        "build_s": build,
        "rss": rss1,
        "rss_growth": rss1 - rss0,
        "batched_qps": len(batch) / t_dense,
        "single_qps": single_dense,
        "raw_ratio": ratio,
        "encode_rate": encode_rate,
    }

    t0 = time.perf_counter()
    bm25 = BM25Retriever(world.corpus)
    bm25_build = time.perf_counter() - t0
    hybrid = HybridRetriever([bm25, dense])
    rss2 = rss_bytes()
    hybrid.retrieve(batch[:4], k)
    (t_hybrid,) = best_of(args.repeats, lambda: hybrid.retrieve(batch, k))
    single_hybrid = single_rate(hybrid.retrieve, single, k)
    print(
        f"  hybrid (RRF of BM25 and dense, depth 100) build {build + bm25_build:.1f}s (dense "
        f"{build:.1f}s + BM25 {bm25_build:.1f}s); RSS {mb(rss2)} (+{mb(rss2 - rss0)}); batched "
        f"{len(batch) / t_hybrid:,.1f} q/s; single-query {single_hybrid:,.1f} q/s"
    )
    out["hybrid"] = {
        "build_s": build + bm25_build,
        "rss": rss2,
        "batched_qps": len(batch) / t_hybrid,
        "single_qps": single_hybrid,
    }


CELLS = {"bm25": cell_bm25, "bm25_load": cell_bm25_load, "dense": cell_dense}


def run_cell(cell: str, size: int, args, extra: list[str] = ()) -> dict:
    argv = ["--cell", cell, "--size", str(size)]
    for name in (
        "k",
        "queries",
        "single",
        "repeats",
        "numpy_queries",
        "rank_bm25_max",
        "rank_bm25_queries",
        "dense_queries",
        "dense_single",
    ):
        argv += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    return run_step(__file__, argv + list(extra), name=cell)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--dense-max", type=int, default=10_000, help="largest dense corpus")
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--queries", type=int, default=4000, help="BM25 batched queries")
    parser.add_argument("--single", type=int, default=500, help="BM25 single-query calls")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--numpy-queries", type=int, default=50)
    parser.add_argument("--rank-bm25-max", type=int, default=100_000)
    parser.add_argument("--rank-bm25-queries", type=int, default=20)
    parser.add_argument("--dense-queries", type=int, default=256)
    parser.add_argument("--dense-single", type=int, default=32)
    parser.add_argument("--cell", choices=sorted(CELLS), help=argparse.SUPPRESS)
    parser.add_argument("--size", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--save", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.cell:
        out: dict = {}
        try:
            CELLS[args.cell](args, out)
        finally:
            Path(args.result).write_text(json.dumps(out))
        return

    print(
        f"retrieval sweep on {len(os.sched_getaffinity(0))} CPU cores; load average at the "
        f"start {os.getloadavg()[0]:.1f}; sizes {args.sizes}, dense up to {args.dense_max:,}"
    )
    results: dict[int, dict] = {}
    encode_rate = None
    for n in sorted(args.sizes):
        print(f"\n== SynthHop, {n:,} passages ==")
        tmp = Path(tempfile.mkdtemp(prefix="rag-gym-sweep-"))
        try:
            res = run_cell("bm25", n, args, ["--save", str(tmp / "bm25")])
            if (tmp / "bm25").exists():
                res.update(run_cell("bm25_load", n, args, ["--save", str(tmp / "bm25")]))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        if n <= args.dense_max:
            res.update(run_cell("dense", n, args))
            encode_rate = res.get("dense", {}).get("encode_rate", encode_rate)
        else:
            eta = (
                f"~{n / encode_rate / 60:,.0f} min at the {encode_rate:,.0f} passages/s measured"
                if encode_rate
                else "longer than this run allows (tens of passages/s on 2 CPU cores)"
            )
            reason = f"encoding {n:,} passages would take {eta}; raise --dense-max to run it"
            print(f"  dense: skipped: {reason}")
            print("  hybrid: skipped: it needs the dense index")
        results[n] = res

    print(f"\n== targets (load average at the end {os.getloadavg()[0]:.1f}) ==")

    def verdict(ok: bool) -> str:
        return "MET" if ok else "MISSED"

    million = results.get(1_000_000, {})
    if "bm25" in million:
        rate = million["bm25"]["batched_qps"]
        print(f"BM25 1M batched >= 1,000 q/s on 2 cores: {rate:,.0f} q/s: {verdict(rate >= 1000)}")
        if "bm25_load" in million:
            rss = million["bm25_load"]["rss"]
            print(
                f"BM25 1M index <= 1.5 GB resident (fresh process serving it: corpus, arrays, "
                f"runtime): {rss / GB:.2f} GB: {verdict(rss <= 1.5 * GB)}; the building process "
                f"held {million['bm25']['rss'] / GB:.2f} GB with the SynthHop world"
            )
    else:
        print("BM25 1M targets: not run (add 1000000 to --sizes)")
    for n, res in sorted(results.items()):
        if "bm25" in res:
            ratio = res["bm25"]["raw_ratio"]
            print(
                f"BM25 wrapper / raw bm25s at {n:,}: {ratio:.2f} (<= 1.1): {verdict(ratio <= 1.1)}"
            )
        if "dense" in res:
            ratio = res["dense"]["raw_ratio"]
            print(
                f"dense wrapper / raw sentence-transformers + FAISS at {n:,}: {ratio:.2f} "
                f"(<= 1.1): {verdict(ratio <= 1.1)}"
            )


if __name__ == "__main__":
    main()

"""Load time and memory of a prebuilt FAISS index through ``DenseRetriever.from_faiss``.

    python benchmarks/faiss_load.py --vectors 1000000 --dim 384

Writes a flat inner-product index of ``--vectors`` random unit vectors of ``--dim`` dimensions
with ``faiss.write_index`` (what FlashRAG's builder and Search-R1's ``e5_Flat.index`` are) and a
``{id, contents}`` JSONL of as many short rows, then, each in a fresh subprocess:

1. ``faiss.read_index`` alone, memory-mapped (``IO_FLAG_MMAP_IFC``) and read into memory;
2. ``DenseRetriever.from_faiss`` (mapped), with a stub encoder of the right dimension, so the
   figure is the index and the corpus, not a model load.

Prints seconds and the process's resident memory (RSS) after the load and after one search of
``--queries`` queries (a flat search reads every vector, so the mapped pages then count), and
the ratios mapped / in memory. Files go to ``--dir`` (default: a temporary folder, removed).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

CHILD = textwrap.dedent(
    """
    import json, sys, time
    import numpy as np

    def rss_mb():
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024

    mode, index_path, corpus_path, dim, n_queries = sys.argv[1:6]
    dim, n_queries = int(dim), int(n_queries)
    import faiss
    from rag_gym.retrieval.dense import DenseRetriever

    base = rss_mb()
    t0 = time.perf_counter()
    if mode == "retriever":
        def encoder(texts):
            rng = np.random.default_rng(len(texts))
            return rng.standard_normal((len(texts), dim)).astype(np.float32)

        r = DenseRetriever.from_faiss(index_path, corpus_path, encoder, mmap=True)
        search = lambda q: r._index.search(q, 3)
    else:
        flags = faiss.IO_FLAG_MMAP_IFC | faiss.IO_FLAG_READ_ONLY if mode == "mmap" else 0
        index = faiss.read_index(index_path, flags)
        search = lambda q: index.search(q, 3)
    load_s = time.perf_counter() - t0
    after_load = rss_mb()
    q = np.random.default_rng(0).standard_normal((n_queries, dim)).astype(np.float32)
    t0 = time.perf_counter()
    search(q)
    search_s = time.perf_counter() - t0
    print(json.dumps({"load_s": load_s, "rss_base": base, "rss_load": after_load,
                      "search_s": search_s, "rss_search": rss_mb()}))
    """
)


def run_child(mode: str, index: Path, corpus: Path, dim: int, queries: int) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, mode, str(index), str(corpus), str(dim), str(queries)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vectors", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--queries", type=int, default=16)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()

    import faiss
    import numpy as np

    folder = args.dir or Path(tempfile.mkdtemp(prefix="rag-gym-faiss-"))
    folder.mkdir(parents=True, exist_ok=True)
    index_path, corpus_path = folder / "flat.index", folder / "corpus.jsonl"
    try:
        t0 = time.perf_counter()
        index = faiss.IndexFlatIP(args.dim)
        rng = np.random.default_rng(0)
        for start in range(0, args.vectors, 100_000):
            x = rng.standard_normal((min(100_000, args.vectors - start), args.dim), np.float32)
            index.add(x / np.linalg.norm(x, axis=1, keepdims=True))
        faiss.write_index(index, str(index_path))
        del index
        with open(corpus_path, "w") as f:
            for i in range(args.vectors):
                f.write(json.dumps({"id": str(i), "contents": f'"T{i}"\npassage {i}'}) + "\n")
        size_mb = index_path.stat().st_size / 2**20
        print(
            f"wrote {args.vectors:,} x {args.dim} flat index ({size_mb:,.0f} MB) and its corpus "
            f"in {time.perf_counter() - t0:.1f}s"
        )
        rows = {m: run_child(m, index_path, corpus_path, args.dim, args.queries)
                for m in ("mmap", "memory", "retriever")}  # fmt: skip
        print(f"{'load':<34}{'seconds':>9}{'RSS after load':>16}{'RSS after search':>18}")
        names = {
            "mmap": "faiss.read_index, mapped",
            "memory": "faiss.read_index, in memory",
            "retriever": "DenseRetriever.from_faiss (mapped)",
        }
        for mode, r in rows.items():
            print(
                f"{names[mode]:<34}{r['load_s']:>8.2f}s{r['rss_load']:>13.0f} MB"
                f"{r['rss_search']:>15.0f} MB"
            )
        m, r = rows["mmap"], rows["memory"]
        print(f"mapped / in memory: load time {m['load_s'] / r['load_s']:.3f}, RSS after load "
              f"{m['rss_load'] / r['rss_load']:.3f}")  # fmt: skip
        print(
            f"from_faiss: {rows['retriever']['load_s']:.1f}s, of which the index is "
            f"{m['load_s']:.2f}s and the rest the {args.vectors:,}-row corpus JSONL"
        )
    finally:
        if args.dir is None:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()

"""Load one saved BM25 index in this process and print what the load cost: seconds, and RSS
after it split into mapped file pages and anonymous memory (``/proc/self/status``), beside the
RSS before it. Then one query, to show the index answers.

Run it in two checkouts on the same index to compare commits (imports happen before the
timing; the first run of a checkout may compile numba kernels, so run each twice)::

    python benchmarks/bm25_load.py INDEX_DIR [--verify]
"""

from __future__ import annotations

import argparse
import time


def rss() -> dict[str, float]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS", "RssFile", "RssAnon")):
                key, value = line.split(":")
                out[key] = int(value.split()[0]) / 1e6  # kB -> GB
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("index")
    parser.add_argument("--verify", action="store_true", help="check every byte and value")
    parser.add_argument("--query", default="Who directed the film about the lantern?")
    args = parser.parse_args()

    import bm25s  # noqa: F401  (imports outside the timing)
    import numba  # noqa: F401

    from rag_gym.retrieval import BM25Retriever

    before = rss()
    t0 = time.perf_counter()
    bm25 = BM25Retriever.load(args.index, verify=args.verify)
    seconds = time.perf_counter() - t0
    after = rss()
    hit = bm25.retrieve([args.query], 1).ids[0]
    print(
        f"load {seconds:.2f} s; RSS {after['VmRSS']:.3f} GB after it (mapped files "
        f"{after['RssFile']:.3f}, anonymous {after['RssAnon']:.3f}), {before['VmRSS']:.3f} GB "
        f"before; {len(bm25.corpus):,} passages; top-1 for {args.query!r}: {hit}"
    )


if __name__ == "__main__":
    main()

"""Block-max top-k on a corpus where thousands of passages tie at the k-th best score.

    python benchmarks/bm25_ties.py --passages 200000

Templated text ("the NAME NOUN": a unique name, one of five nouns, so every passage of a noun
has the same length and the same contribution for it) is what SynthHop's work passages look
like, and where a pruning kernel that cannot drop a tie walks the whole tie group. Each query is
one passage's name and noun: its top-1 is that passage, and the 2nd to k-th places are a tie
among a fifth of the corpus, broken by passage id. The block-max kernel (the numba backend) and
exhaustive scoring (the numpy backend: bm25s's full score array and a top-k over it) run the
same queries in one process; their results must be identical, and the ratio is printed.
"""

from __future__ import annotations

import argparse
import random
import time

from rag_gym.data import Corpus, Passage
from rag_gym.retrieval import BM25Retriever

NOUNS = ["lantern", "harbour", "mirror", "garden", "river"]
SYLLABLES = ["ka", "zo", "ri", "mu", "te", "lo", "vi", "na", "pe", "su"]


def name(i: int) -> str:
    out = ""
    for _ in range(6):
        out += SYLLABLES[i % 10]
        i //= 10
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--passages", type=int, default=200_000)
    parser.add_argument("--queries", type=int, default=400)
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    n = args.passages
    corpus = Corpus([Passage(f"w{i:07d}", "", f"the {name(i)} {NOUNS[i % 5]}") for i in range(n)])
    retrievers = {
        "blockmax": BM25Retriever(corpus, backend="numba"),
        "exhaustive": BM25Retriever(corpus, backend="numpy"),
    }
    rng = random.Random(0)
    queries = [f"{name(i)} {NOUNS[i % 5]}" for i in rng.sample(range(n), args.queries)]
    rates, results = {}, {}
    for kind, bm25 in retrievers.items():
        bm25.retrieve(queries[:10], args.k)  # warm-up
        best = float("inf")
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            results[kind] = bm25.retrieve(queries, args.k)
            best = min(best, time.perf_counter() - t0)
        rates[kind] = len(queries) / best
    assert results["blockmax"] == results["exhaustive"], "block-max differs from exhaustive"
    tied = results["exhaustive"].scores[0]
    print(f"{n:,} templated passages, {len(queries)} queries, k={args.k}, 2nd..kth tied: {tied}")
    print(f"block-max {rates['blockmax']:,.0f} q/s, exhaustive {rates['exhaustive']:,.0f} q/s")
    print(f"block-max / exhaustive: {rates['blockmax'] / rates['exhaustive']:.1f}x (same top-k)")


if __name__ == "__main__":
    main()

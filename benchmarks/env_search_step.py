"""Env SEARCH step time against the raw ``bm25s`` retrieve time on the same queries.

    python benchmarks/env_search_step.py --passages 100000 --queries 600

Both sides tokenise the same way (bm25s.tokenize, English stop words, PyStemmer) over the same
SynthHop corpus and retrieve k=3 for one query at a time, which is what an agent's SEARCH does.
The env side is a full ``gym.make("rag_gym/SynthHop-v0")`` step (wrappers, tie-breaking by id,
observation rendering and validation); resets happen outside the timed region. The figure to
read is the ratio (target <= 1.15). Each side is timed ``--repeats`` times, interleaved, and the
fastest repeat counts, which filters out noise from other processes.
"""

from __future__ import annotations

import argparse
import time

import bm25s
import gymnasium as gym
import Stemmer

import rag_gym  # noqa: F401
from rag_gym.data.synthhop import world_for
from rag_gym.envs import ActionType


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--passages", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=600)
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    world_kwargs = {"preset": "hard", "n_passages": args.passages}
    world = world_for(**world_kwargs)
    questions = world.questions["train"]
    # the queries an agent would issue: questions and their hop-by-hop sub-questions
    queries: list[str] = []
    for q in questions:
        queries.append(q.question)
        queries.extend(step["question"] for step in q.meta["decomposition"])
    queries = queries[: args.queries]

    t0 = time.perf_counter()
    env = gym.make("rag_gym/SynthHop-v0", dataset_kwargs=world_kwargs, k=args.k)
    print(
        f"corpus: {len(world.corpus):,} passages; env built (BM25 index) in {time.perf_counter() - t0:.1f}s"
    )

    stemmer = Stemmer.Stemmer("english")
    raw = bm25s.BM25()
    raw.index(
        bm25s.tokenize(
            world.corpus.contents(), stopwords="en", stemmer=stemmer, show_progress=False
        ),
        show_progress=False,
    )

    def time_raw() -> float:
        t = time.perf_counter()
        for q in queries:
            tokens = bm25s.tokenize([q], stopwords="en", stemmer=stemmer, show_progress=False)
            raw.retrieve(tokens, k=args.k, show_progress=False)
        return time.perf_counter() - t

    def time_env() -> float:
        total = 0.0
        env.reset(seed=0)
        for i, q in enumerate(queries):
            if i % 19 == 0:
                env.reset(seed=i)
            action = {"type": ActionType.SEARCH, "text": q}
            t = time.perf_counter()
            env.step(action)
            total += time.perf_counter() - t
        return total

    time_env()  # warm-up (first step runs Gymnasium's passive checker)
    raw_times, env_times = [], []
    for _ in range(args.repeats):
        raw_times.append(time_raw())
        env_times.append(time_env())
    raw_best, env_best = min(raw_times), min(env_times)
    n = len(queries)
    print(f"queries: {n}, k={args.k}, best of {args.repeats} repeats")
    print(
        f"raw bm25s retrieve : {raw_best / n * 1e3:8.3f} ms/query ({n / raw_best:8.1f} queries/s)"
    )
    print(f"env SEARCH step    : {env_best / n * 1e3:8.3f} ms/step  ({n / env_best:8.1f} steps/s)")
    print(f"ratio env / raw    : {env_best / raw_best:.3f}  (target <= 1.15)")


if __name__ == "__main__":
    main()

"""Env SEARCH step time against the raw ``bm25s`` retrieve time on the same queries.

    python benchmarks/env_search_step.py --passages 100000 --queries 600

Both sides tokenise the same way (bm25s.tokenize, English stop words, PyStemmer) over the same
SynthHop corpus and retrieve k=3 for one query at a time, which is what an agent's SEARCH does;
raw bm25s uses its numba backend (one thread) when numba is installed, as rag-gym does.
The env side is a full ``gym.make("rag_gym/SynthHop-v0")`` step (wrappers, tie-breaking by id,
observation rendering and validation); resets happen outside the timed region. The figure to
read is the ratio (target <= 1.15). Each side is timed ``--repeats`` times, interleaved, and the
fastest repeat counts, which filters out noise from other processes. The rag-gym retriever alone
is timed too, so the env's own per-step work shows; raw bm25s's default (numpy) backend is timed
on ``--numpy-queries`` queries for reference.
"""

from __future__ import annotations

import argparse
import importlib.util
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
    parser.add_argument("--numpy-queries", type=int, default=100, help="for raw bm25s numpy")
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
    tokens = bm25s.tokenize(
        world.corpus.contents(), stopwords="en", stemmer=stemmer, show_progress=False
    )
    # bm25s's fastest setting for one query at a time: numba when installed, one thread
    backend = "numba" if importlib.util.find_spec("numba") else "numpy"
    raw = bm25s.BM25(backend=backend)
    raw.index(tokens, show_progress=False)
    raw_numpy = bm25s.BM25()  # bm25s's default backend, what the env was first compared with
    raw_numpy.index(tokens, show_progress=False)
    retriever = env.unwrapped.retriever

    def time_raw(model, qs: list[str]) -> float:
        t = time.perf_counter()
        for q in qs:
            toks = bm25s.tokenize([q], stopwords="en", stemmer=stemmer, show_progress=False)
            model.retrieve(toks, k=args.k, show_progress=False, n_threads=1)
        return time.perf_counter() - t

    def time_retriever() -> float:
        t = time.perf_counter()
        for q in queries:
            retriever.retrieve([q], args.k)
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
    time_raw(raw, queries[:20])  # warm-up (bm25s compiles its numba functions on first use)
    raw_times, env_times, ours_times = [], [], []
    for _ in range(args.repeats):
        raw_times.append(time_raw(raw, queries))
        ours_times.append(time_retriever())
        env_times.append(time_env())
    few = queries[: args.numpy_queries]
    numpy_best = min(time_raw(raw_numpy, few) for _ in range(2)) / len(few)
    n = len(queries)
    raw_best, env_best, ours_best = min(raw_times) / n, min(env_times) / n, min(ours_times) / n
    print(
        f"queries: {n}, k={args.k}, one at a time, best of {args.repeats} repeats; rag-gym BM25 "
        f"backend {retriever.backend}"
    )
    print(f"raw bm25s ({backend}, 1 thread)  : {raw_best * 1e3:8.3f} ms/query")
    print(f"raw bm25s (numpy, default)  : {numpy_best * 1e3:8.3f} ms/query ({len(few)} queries)")
    print(f"rag-gym BM25Retriever       : {ours_best * 1e3:8.3f} ms/query")
    print(f"env SEARCH step             : {env_best * 1e3:8.3f} ms/step")
    print(
        f"ratio env / raw bm25s {backend:<6}: {env_best / raw_best:.3f}  (target <= 1.15): "
        f"{'MET' if env_best <= 1.15 * raw_best else 'MISSED'}; the env's own work per step "
        f"(wrappers, rendering, checks) is {(env_best - ours_best) * 1e3:.3f} ms"
    )
    print(f"ratio env / raw bm25s numpy : {env_best / numpy_best:.3f}")
    print(f"ratio retriever / raw bm25s {backend}: {ours_best / raw_best:.3f}")


if __name__ == "__main__":
    main()

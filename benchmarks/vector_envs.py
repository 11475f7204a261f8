"""Steps per second: one env against ``AsyncVectorEnv(4)`` (``gym.make_vec(..., "async")``).

    python benchmarks/vector_envs.py --passages 100000 --steps 400

Every step is a SEARCH with a real sub-question of the SynthHop world (BM25 over the whole
corpus, k = 3). The index is built once, saved, and memory-mapped by every worker
(``index=DIR``), so the four processes share one copy. Construction is not timed; episode
resets are (the vector env resets finished sub-envs itself). Target: ratio >= 1.5 on 2 cores.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import gymnasium as gym
import numpy as np

import rag_gym  # noqa: F401
from rag_gym.data.synthhop import world_for
from rag_gym.envs import ActionType
from rag_gym.retrieval import BM25Retriever


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--passages", type=int, default=100_000)
    parser.add_argument("--steps", type=int, default=400, help="env steps per measurement")
    parser.add_argument("--num-envs", type=int, default=4)
    args = parser.parse_args()

    world_kwargs = {"preset": "hard", "n_passages": args.passages}
    world = world_for(**world_kwargs)
    queries = [s["question"] for q in world.questions["train"] for s in q.meta["decomposition"]]
    index_dir = tempfile.mkdtemp(prefix="rag-gym-index-") + "/bm25"
    BM25Retriever(world.corpus).save(index_dir)
    kwargs = {"dataset_kwargs": world_kwargs, "index": index_dir}

    env = gym.make("rag_gym/SynthHop-Hard-v0", **kwargs)
    env.reset(seed=0)
    t0 = time.perf_counter()
    for i in range(args.steps):
        _, _, term, trunc, _ = env.step(
            {"type": ActionType.SEARCH, "text": queries[i % len(queries)]}
        )
        if term or trunc:
            env.reset()
    single = args.steps / (time.perf_counter() - t0)
    env.close()

    n = args.num_envs
    venv = gym.make_vec(
        "rag_gym/SynthHop-Hard-v0", num_envs=n, vectorization_mode="async", **kwargs
    )
    venv.reset(seed=0)
    calls = args.steps // n
    t0 = time.perf_counter()
    for i in range(calls):
        texts = tuple(queries[(i * n + j) % len(queries)] for j in range(n))
        venv.step({"type": np.zeros(n, dtype=np.int64), "text": texts})
    vector = calls * n / (time.perf_counter() - t0)
    venv.close()

    print(f"corpus: {len(world.corpus):,} passages, SEARCH steps, k=3")
    print(f"1 env           : {single:8.1f} steps/s")
    print(f"AsyncVectorEnv({n}): {vector:8.1f} steps/s")
    print(f"ratio           : {vector / single:.2f}  (target >= 1.5)")


if __name__ == "__main__":
    main()

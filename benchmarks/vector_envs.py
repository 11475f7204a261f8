"""Steps per second: one env, then N episodes as ``SyncVectorEnv``, ``AsyncVectorEnv`` and the
native vector env (``gym.make_vec(..., vectorization_mode=...)`` with ``"sync"``, ``"async"`` and
``"vector_entry_point"``), each as a ratio to the one env measured in the same run.

    python benchmarks/vector_envs.py --passages 100000 --steps 400

Every step is a SEARCH with a real sub-question of the SynthHop world (BM25 over the whole
corpus, k = 3). The index is built once, saved, and memory-mapped by every env and worker
(``index=DIR``), so the processes share one copy. Construction is not timed; episode resets
are (a vector env resets finished sub-envs itself). The native vector env steps the N episodes
in one process and sends their N queries to the retriever in one batched call. Targets: native
>= 3x one env at N = 8; async >= 1.5x. Both envs do the same Python work per episode step, so
the native ratio stays below the batched retrieval's own speedup per query (about 2.5x at N = 8
with one BM25 thread on the 2-core machine; docs/results/speed.md has the breakdown).
"""

from __future__ import annotations

import argparse
import gc
import tempfile
import time

import gymnasium as gym
import numpy as np

import rag_gym  # noqa: F401
from rag_gym.data.synthhop import world_for
from rag_gym.envs import ActionType
from rag_gym.retrieval import BM25Retriever

MODES = ("sync", "async", "vector_entry_point")


class SingleRunner:
    """One ``gym.make`` env stepping SEARCH actions (resetting when an episode ends)."""

    def __init__(self, kwargs: dict, queries: list[str]) -> None:
        self.env = gym.make("rag_gym/SynthHop-Hard-v0", **kwargs)
        self.env.reset(seed=0)
        self.queries, self.i = queries, 0

    def __call__(self, steps: int) -> float:
        t0 = time.perf_counter()
        for _ in range(steps):
            query = self.queries[self.i % len(self.queries)]
            self.i += 1
            _, _, term, trunc, _ = self.env.step({"type": ActionType.SEARCH, "text": query})
            if term or trunc:
                self.env.reset()
        return steps / (time.perf_counter() - t0)


class VectorRunner:
    """``gym.make_vec(..., vectorization_mode=mode)`` stepping N SEARCH actions per call."""

    def __init__(self, mode: str, n: int, kwargs: dict, queries: list[str]) -> None:
        self.venv = gym.make_vec(
            "rag_gym/SynthHop-Hard-v0", num_envs=n, vectorization_mode=mode, **kwargs
        )
        self.venv.reset(seed=0)
        self.n, self.queries, self.i = n, queries, 0
        self.types = np.zeros(n, dtype=np.int64)

    def __call__(self, steps: int) -> float:
        calls = max(1, steps // self.n)
        t0 = time.perf_counter()
        for _ in range(calls):
            texts = tuple(self.queries[(self.i + j) % len(self.queries)] for j in range(self.n))
            self.i += self.n
            self.venv.step({"type": self.types, "text": texts})
        return calls * self.n / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--passages", type=int, default=100_000)
    parser.add_argument("--steps", type=int, default=400, help="env steps per measurement")
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--modes", default=",".join(MODES), help="vector modes to measure")
    parser.add_argument(
        "--repeats",
        type=int,
        default=5,
        help="rounds, each measuring every env in turn; the median round is reported (the "
        "interleaving keeps a shared machine's load changes from favouring one env)",
    )
    args = parser.parse_args()

    world_kwargs = {"preset": "hard", "n_passages": args.passages}
    world = world_for(**world_kwargs)
    queries = [s["question"] for q in world.questions["train"] for s in q.meta["decomposition"]]
    index_dir = tempfile.mkdtemp(prefix="rag-gym-index-") + "/bm25"
    BM25Retriever(world.corpus).save(index_dir)
    kwargs = {"dataset_kwargs": world_kwargs, "index": index_dir}

    n = args.num_envs
    runners = {"single": SingleRunner(kwargs, queries)}
    for mode in (m for m in args.modes.split(",") if m):
        runners[mode] = VectorRunner(mode, n, kwargs, queries)
    for run in runners.values():
        run(min(4 * n, args.steps))  # warm-up: index pages, numba compilation, first episodes
    # the world and the envs built above are millions of long-lived objects: left to the
    # collector, each full collection rescans them (50-150 ms), landing in whichever round
    gc.collect()
    gc.freeze()
    rates: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(args.repeats):
        for name, run in runners.items():
            rates[name].append(run(args.steps))
    for run in runners.values():
        getattr(run, "venv", getattr(run, "env", None)).close()
    median = {name: float(np.median(r)) for name, r in rates.items()}
    single = median["single"]

    print(f"corpus: {len(world.corpus):,} passages, SEARCH steps, k=3, N={n}")
    print(f"median of {args.repeats} interleaved rounds of {args.steps} steps each")
    print(f"{'env':<30}{'steps/s':>10}{'ratio':>8}")
    names = {
        "single": "1 env (gym.make)",
        "sync": f"SyncVectorEnv({n})",
        "async": f"AsyncVectorEnv({n})",
        "vector_entry_point": f"native SearchVectorEnv({n})",
    }
    for name, rate in median.items():
        print(f"{names[name]:<30}{rate:>10.1f}{rate / single:>8.2f}")
    print("targets: native >= 3.0, async >= 1.5")


if __name__ == "__main__":
    main()

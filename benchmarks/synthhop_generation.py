"""SynthHop world generation rate.

    python benchmarks/synthhop_generation.py --passages 1000000

Prints passages per second and the wall time for the requested world (target: 1M passages in
at most 2 minutes on 2 CPU cores), plus peak resident memory.
"""

from __future__ import annotations

import argparse
import resource
import time

from rag_gym.data.synthhop import SynthHopConfig, generate


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--passages", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    for n in args.passages:
        config = SynthHopConfig(n_passages=n, seed=args.seed, hops=(2, 3, 4), unanswerable_rate=0.1)
        t0 = time.perf_counter()
        world = generate.__wrapped__(config)  # no cache: time the real work
        seconds = time.perf_counter() - t0
        peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2
        print(
            f"synthhop n_passages={n:>9,}  corpus={len(world.corpus):>9,}  "
            f"questions={sum(len(q) for q in world.questions.values()):,}  "
            f"time={seconds:7.2f}s  rate={len(world.corpus) / seconds:>10,.0f} passages/s  "
            f"peak_rss={peak_gb:.2f} GB"
        )
        del world


if __name__ == "__main__":
    main()

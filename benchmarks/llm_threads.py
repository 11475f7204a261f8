"""llama.cpp's speed at 1 thread and at every core, on an idle machine and beside busy processes.

    python benchmarks/llm_threads.py --busy 0 1 2

The embedded SmolLM2-135M with the shipped SynthHop adapter (what ``rag-gym evaluate`` plays),
one ``LlamaCppLM`` per thread count. For each number of ``--busy`` processes (each a Python
loop that keeps one core busy, as another evaluation at one thread would), it measures raw
prefill and decode tokens/s (``benchmarks/llm_loop.py``'s ``raw_speeds``: 1,024 tokens
evaluated, 128 greedy tokens generated, the best of ``--repeats``) at each thread count, and
prints which count is faster. ``RAG_GYM_THREADS`` is ignored here; the default it overrides is
every core.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from llm_loop import raw_speeds

from rag_gym.agents.search_r1 import checkpoint_path
from rag_gym.generation.adapters import adapter_gguf
from rag_gym.generation.llama_cpp import LlamaCppLM


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--busy", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--threads", type=int, nargs="+", default=None)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    counts = args.threads or sorted({1, cores})
    adapter = adapter_gguf(checkpoint_path("synthhop"))
    lms = {t: LlamaCppLM(n_threads=t, adapter=adapter) for t in counts}
    print(f"{cores} cores; thread counts {counts}; busy processes {args.busy}")
    print("| busy processes | threads | prefill tok/s | decode tok/s |")
    print("|---|---|---|---|")
    for busy in args.busy:
        procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
        try:
            time.sleep(1.0)
            speeds = {t: raw_speeds(lm, args.repeats) for t, lm in lms.items()}
        finally:
            for p in procs:
                p.kill()
                p.wait()
        for t, (pre, dec) in speeds.items():
            print(f"| {busy} | {t} | {pre:.0f} | {dec:.0f} |")
        best_pre = max(speeds, key=lambda t: speeds[t][0])
        best_dec = max(speeds, key=lambda t: speeds[t][1])
        print(f"|   | faster: prefill at {best_pre}, decode at {best_dec} thread(s) | | |")


if __name__ == "__main__":
    main()

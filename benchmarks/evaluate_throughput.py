"""rag-gym evaluate's generation throughput against the raw backend, and batched evaluation.

    python benchmarks/evaluate_throughput.py --episodes 32

With the transformers backend on the embedded SmolLM2-135M (CPU):

1. ``evaluate`` runs Naive RAG on SynthHop-v0 with ``batch_size=8`` while a recording proxy
   keeps every prompt it sends; then the raw backend generates the same prompts, in the same
   batches of 8, with the same settings. Ratio = evaluate's completion tokens/s over the raw
   backend's (target >= 0.9): the env, retrieval and bookkeeping around generation cost little.
2. The same evaluation with ``batch_size=8`` against ``batch_size=1`` (target >= 3x faster).
"""

from __future__ import annotations

import argparse
import tempfile
import time

import rag_gym  # noqa: F401
from rag_gym.agents.lm import LanguageModel
from rag_gym.agents.transformers_lm import TransformersLM
from rag_gym.baselines import make_agent
from rag_gym.evaluate import EvalConfig, evaluate


class Recorder(LanguageModel):
    """Passes calls through and keeps (prompts, config) of each."""

    def __init__(self, lm: LanguageModel) -> None:
        self.lm, self.calls, self.name = lm, [], lm.name

    def generate(self, prompts, config=None):
        self.calls.append((list(prompts), config))
        return self.lm.generate(prompts, config)


def run(lm: LanguageModel, episodes: int, batch: int, out: str, agent: str) -> tuple[float, int]:
    cfg = EvalConfig(
        n=episodes, seed=0, agents=(agent,), batch_size=batch, out_dir=out, run_name=f"b{batch}"
    )
    t0 = time.perf_counter()
    result = evaluate(cfg, lambda name, env: make_agent(name, lm=lm))
    seconds = time.perf_counter() - t0
    tokens = sum(e["completion_tokens"] for e in result.episodes)
    return seconds, tokens


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument(
        "--agents", default="naive_rag,cot", help="agents to measure, comma-separated"
    )
    args = parser.parse_args()
    out = tempfile.mkdtemp(prefix="rag-gym-bench-")
    lm = TransformersLM(batch_size=8)
    run(lm, 4, 4, out, "naive_rag")  # warm-up (index build, first forward passes)
    for agent in args.agents.split(","):
        recorder = Recorder(lm)
        eval_seconds, eval_tokens = run(recorder, args.episodes, 8, out, agent)
        t0 = time.perf_counter()
        raw_tokens = 0
        for prompts, config in recorder.calls:
            raw_tokens += sum(g[0].completion_tokens for g in lm.generate(prompts, config))
        raw_seconds = time.perf_counter() - t0
        eval_rate, raw_rate = eval_tokens / eval_seconds, raw_tokens / raw_seconds
        one_seconds, _ = run(lm, args.episodes, 1, out, agent)
        print(
            f"\n{agent}: {args.episodes} episodes, transformers backend (SmolLM2-135M, CPU), batch 8"
        )
        print(
            f"  evaluate      : {eval_tokens} tokens in {eval_seconds:6.1f}s = {eval_rate:6.1f} tokens/s"
        )
        print(
            f"  raw backend   : {raw_tokens} tokens in {raw_seconds:6.1f}s = {raw_rate:6.1f} tokens/s"
        )
        print(f"  ratio evaluate / raw : {eval_rate / raw_rate:.2f}  (target >= 0.9)")
        print(f"  batch 8: {eval_seconds:6.1f}s   batch 1: {one_seconds:6.1f}s")
        print(
            f"  speed-up of batched evaluation : {one_seconds / eval_seconds:.2f}x  (target >= 3)"
        )


if __name__ == "__main__":
    main()

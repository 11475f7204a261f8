"""rag-gym evaluate's generation throughput against the raw backend, and batched evaluation.

    python benchmarks/evaluate_throughput.py --episodes 32

With the transformers backend on the embedded SmolLM2-135M (CPU), for each agent:

1. ``evaluate`` runs the agent on SynthHop-v0 with ``batch_size=8`` (8 episodes in flight, their
   requests in one continuously batched generation) while a recording proxy keeps every prompt
   it sends and every reply. Then the raw backend generates the same prompts with the same
   settings in one ``generate`` call (8 rows at a time, all prompts known up front: the backend
   at its best). Ratio = evaluate's completion tokens/s over the raw backend's (target >= 0.9):
   the env, retrieval and the episodes' turn-taking cost little.
2. The same evaluation with ``batch_size=1`` (one episode, one request at a time) against
   ``batch_size=8``, in the same run on the same model (target: batched >= 3x faster).

Each figure is the best of ``--repeats`` rounds (default 3), every round printed: other work
on a shared machine only ever slows a round down. Both evaluations play the same questions
with greedy decoding; the script prints how many episodes came out the same (actions,
prediction, tokens) and how many raw replies equal the evaluator's. A few may differ: a step's
matrix products round differently in the last bits with 8 rows than with 1, which can flip a
near-tie between two tokens.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch

import rag_gym  # noqa: F401
from rag_gym.baselines import make_agent
from rag_gym.evaluate import EvalConfig, evaluate
from rag_gym.generation.lm import LanguageModel
from rag_gym.generation.transformers_lm import TransformersLM


class Recorder(LanguageModel):
    """Passes calls through and keeps (prompts, config, reply texts) of each."""

    def __init__(self, lm: LanguageModel) -> None:
        self.lm, self.calls, self.name = lm, [], lm.name
        self.concurrent_clients = lm.concurrent_clients

    def generate(self, prompts, config=None):
        out = self.lm.generate(prompts, config)
        self.calls.append((list(prompts), config, [g[0].text for g in out]))
        return out

    def run_clients(self, clients):
        self.lm.run_clients(clients)


def run(lm: LanguageModel, episodes: int, batch: int, out: str, agent: str):
    cfg = EvalConfig(
        n=episodes, seed=0, agents=(agent,), batch_size=batch, out_dir=out, run_name=f"b{batch}"
    )
    t0 = time.perf_counter()
    result = evaluate(cfg, lambda name, env: make_agent(name, lm=lm))
    seconds = time.perf_counter() - t0
    tokens = sum(e["completion_tokens"] for e in result.episodes)
    return seconds, tokens, result.episodes


def outcome(episode: dict) -> tuple:
    return (
        episode["question_id"],
        episode["actions"],
        episode["prediction"],
        episode["completion_tokens"],
        episode["error"],
    )


def replay(lm: LanguageModel, calls: list) -> tuple[float, int, int, int]:
    """The recorded prompts through the raw backend: seconds, tokens, equal replies, replies."""
    groups: list[tuple] = []  # consecutive calls with the same settings, replayed together
    for prompts, config, texts in calls:
        if groups and groups[-1][0] == config:
            groups[-1][1].extend(prompts)
            groups[-1][2].extend(texts)
        else:
            groups.append((config, list(prompts), list(texts)))
    seconds, tokens, same, replies = 0.0, 0, 0, 0
    for config, prompts, texts in groups:
        t0 = time.perf_counter()
        gens = lm.generate(prompts, config)
        seconds += time.perf_counter() - t0
        tokens += sum(g[0].completion_tokens for g in gens)
        same += sum(g[0].text == t for g, t in zip(gens, texts, strict=True))
        replies += len(texts)
    return seconds, tokens, same, replies


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument(
        "--agents", default="naive_rag,cot", help="agents to measure, comma-separated"
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="rounds of (batch 8, raw backend, batch 1); the best time of each is reported, "
        "so that other work on a shared machine inflates the figures less",
    )
    args = parser.parse_args()
    out = tempfile.mkdtemp(prefix="rag-gym-bench-")
    lm = TransformersLM(batch_size=8)
    run(lm, 4, 4, out, "naive_rag")  # warm-up (index build, first forward passes)
    for agent in args.agents.split(","):
        print(
            f"\n{agent}: {args.episodes} episodes, transformers backend (SmolLM2-135M, CPU, "
            f"{torch.get_num_threads()} threads), seconds per round:"
        )
        best: dict[str, float] = {}
        same, raw_same, replies = [], [], 0
        for i in range(args.repeats):
            recorder = Recorder(lm)
            eval_seconds, eval_tokens, batched = run(recorder, args.episodes, 8, out, agent)
            raw_seconds, raw_tokens, equal, replies = replay(lm, recorder.calls)
            one_seconds, one_tokens, single = run(lm, args.episodes, 1, out, agent)
            same.append(sum(outcome(a) == outcome(b) for a, b in zip(batched, single, strict=True)))
            raw_same.append(equal)
            print(
                f"  round {i + 1}: evaluate batch 8 {eval_seconds:6.1f}   raw backend "
                f"{raw_seconds:6.1f}   evaluate batch 1 {one_seconds:6.1f}"
            )
            for key, value in (("eval", eval_seconds), ("raw", raw_seconds), ("one", one_seconds)):
                best[key] = min(best.get(key, value), value)
        eval_rate, raw_rate = eval_tokens / best["eval"], raw_tokens / best["raw"]
        print(
            f"  evaluate, 8 in flight : {eval_tokens} tokens in {best['eval']:6.1f}s = {eval_rate:6.1f} tokens/s"
        )
        print(
            f"  raw backend           : {raw_tokens} tokens in {best['raw']:6.1f}s = {raw_rate:6.1f} tokens/s"
        )
        print(
            f"  evaluate, 1 at a time : {one_tokens} tokens in {best['one']:6.1f}s = "
            f"{one_tokens / best['one']:6.1f} tokens/s"
        )
        print(f"  ratio evaluate / raw : {eval_rate / raw_rate:.2f}  (target >= 0.9)")
        print(
            f"  speed-up of batched evaluation : {best['one'] / best['eval']:.2f}x  (target >= 3)"
        )
        print(
            f"  same greedy outcome, batch 8 vs batch 1 : {min(same)}/{len(single)} episodes; "
            f"raw backend replies equal to evaluate's : {min(raw_same)}/{replies}"
        )


if __name__ == "__main__":
    main()

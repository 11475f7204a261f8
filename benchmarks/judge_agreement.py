"""An LLM answer judge against exact match on an evaluate run's answers: agreement and cost.

    python benchmarks/judge_agreement.py runs/test-hotpotqa                  # the embedded SmolLM2
    python benchmarks/judge_agreement.py runs/RUN --judge openai:qwen@http://127.0.0.1:8000/v1

Every answered episode of the run (``episodes.jsonl``: question, prediction, gold answers, EM,
F1) is put to :class:`rag_gym.generation.judges.LLMAnswerJudge` (its prompt, greedy, with its
cache), as :class:`rag_gym.wrappers.JudgedAnswerReward` would during training. Printed: the
confusion table of the judge's yes/no against EM 1/0, the agreement, the judge's yes rate on
answers EM rejects (split by whether F1 gives them partial credit: the under-scored answers a
judge is for), and the cost: calls, cache hits, seconds a call. Then the same on the EM-0
answers alone, which is all the reward term asks about.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run", type=Path, help="an evaluate run folder")
    parser.add_argument("--judge", default="llama_cpp", help="the judge's backend spec")
    parser.add_argument("--limit", type=int, default=0, help="at most this many answers (0: all)")
    parser.add_argument("--examples", type=int, default=5, help="disagreements to print")
    args = parser.parse_args()

    from rag_gym.evaluate.run_folder import load_episodes
    from rag_gym.generation.backends import make_lm
    from rag_gym.generation.judges import LLMAnswerJudge

    episodes = [
        e
        for e in load_episodes(args.run / "episodes.jsonl")
        if e.get("prediction") and e.get("answerable", True) and not e.get("error")
    ]
    if args.limit:
        episodes = episodes[: args.limit]
    if not episodes:
        sys.exit(f"{args.run}: no answered episodes to judge")
    t0 = time.perf_counter()
    judge = LLMAnswerJudge(make_lm(args.judge))
    load_s = time.perf_counter() - t0
    cells = {(j, m): 0 for j in (True, False) for m in (True, False)}
    partial = {True: 0, False: 0}  # EM-0 answers with F1 > 0: judged yes / no
    none = {True: 0, False: 0}  # EM-0 answers with F1 = 0
    disagree = []
    for e in episodes:
        verdict = judge(e["question"], e["prediction"], e["answers"])
        em = e["em"] == 1.0
        cells[(verdict, em)] += 1
        if not em:
            (partial if e["f1"] > 0 else none)[verdict] += 1
        if verdict != em and len(disagree) < args.examples:
            disagree.append((verdict, e["question"], e["prediction"], e["answers"]))
    n = len(episodes)
    stats = judge.stats()
    print(
        f"{n} answers from {args.run} ({len({e['agent'] for e in episodes})} agents); judge {args.judge}"
    )
    print("                 EM 1   EM 0")
    print(f"  judge yes   {cells[(True, True)]:6d} {cells[(True, False)]:6d}")
    print(f"  judge no    {cells[(False, True)]:6d} {cells[(False, False)]:6d}")
    agree = cells[(True, True)] + cells[(False, False)]
    print(f"agreement with EM: {agree / n:.3f} ({agree} of {n})")
    em1 = cells[(True, True)] + cells[(False, True)]
    if em1:
        print(
            f"yes on EM-1 answers: {cells[(True, True)] / em1:.3f} ({cells[(True, True)]} of {em1})"
        )
    for name, counts in (("F1 > 0", partial), ("F1 = 0", none)):
        total = counts[True] + counts[False]
        if total:
            print(
                f"yes on EM-0 answers with {name}: {counts[True] / total:.3f} ({counts[True]} of {total})"
            )
    calls = stats["calls"] or 1
    print(
        f"cost: {stats['calls']} calls, {stats['cache_hits']} cache hits, {stats['errors']} "
        f"unreadable replies or errors, {stats['seconds']:.1f} s in calls "
        f"({stats['seconds'] / calls:.3f} s a call; model load {load_s:.1f} s)"
    )
    em0 = n - em1
    print(
        f"as a reward term (JudgedAnswerReward asks only about the {em0} EM-0 answers): "
        f"{cells[(True, False)]} would score 1"
    )
    for verdict, question, prediction, golds in disagree:
        print(f"  judge {'yes' if verdict else 'no'}: {question!r} -> {prediction!r}; gold {golds}")
    json.dump(
        {"n": n, "cells": {f"{j}/{m}": c for (j, m), c in cells.items()}, "stats": stats},
        sys.stderr,
    )
    print(file=sys.stderr)


if __name__ == "__main__":
    main()

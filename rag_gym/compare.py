"""Compare two agents of ``rag-gym evaluate`` runs question by question.

A leaderboard's means differ from run to run by sampling alone; whether agent A beats agent B is
answered by the paired bootstrap over the questions both played
(:func:`rag_gym.stats.paired_difference`). :func:`compare` reads the ``episodes.jsonl`` of one or
more run folders (read-only: a last line cut by a kill is skipped with a warning), pairs the two
agents' episodes by ``question_id`` and reports, per metric, both means with their bootstrap
intervals and the interval of the paired difference. Runs on disjoint question sets (a split of
one world and the test split of a second world, whose ids carry the world's seed) pool into one
comparison; an agent that played the same question in two runs is an error.

The refusal rates ``refuse_unans`` and ``refuse_ans`` are paired over the shared questions of
one kind only (unanswerable, answerable); the table names their question count.

``rag-gym compare RUN [RUN ...] --a AGENT --b AGENT`` prints it; ``--json`` writes it.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rag_gym.stats import bootstrap_ci, paired_difference
from rag_gym.traces import BadLine, read_jsonl

DEFAULT_METRICS = ("em", "f1", "recall", "full_recall", "searches")
#: Refusal rates on one kind of question (the leaderboard's ``refuse|unans.`` and
#: ``refuse|ans.``): metric name -> the episodes' ``answerable`` value it keeps. A refusal
#: reward should move the first up and leave the second where it was.
CONDITIONAL_METRICS = {"refuse_unans": False, "refuse_ans": True}


class CompareError(ValueError):
    """A run folder, agent or metric that cannot be compared (the message names the fix)."""


def read_episodes(run_dir: str | Path) -> list[dict[str, Any]]:
    """The episode records of a run folder, without changing it (:func:`rag_gym.traces.read_jsonl`
    under its ``strict`` policy: a last line cut by a kill is skipped with a warning)."""
    run = Path(run_dir)
    path = run / "episodes.jsonl"
    if not path.is_file():
        raise CompareError(
            f"expected a rag-gym evaluate run folder with episodes.jsonl, got {run}: "
            "pass the folder `rag-gym evaluate` printed"
        )
    try:
        records, problems = read_jsonl(
            path, "strict", keys=("agent", "question_id"), what="an episode record"
        )
    except BadLine as exc:
        raise CompareError(str(exc)) from None
    for problem in problems:
        warnings.warn(problem, RuntimeWarning, stacklevel=2)
    return [rec for rec, _ in records]


def _agent_scores(
    runs: Sequence[str | Path], agent: str
) -> tuple[dict[str, dict[str, Any]], list[str]]:
    found: dict[str, dict[str, Any]] = {}
    origin: dict[str, str] = {}  # question id -> the run that played it
    sources = []
    seen_agents: set[str] = set()
    for run in runs:
        episodes = [r for r in read_episodes(run) if r.get("error") is None]
        seen_agents.update(str(r["agent"]) for r in episodes)
        mine = [r for r in episodes if r["agent"] == agent]
        if not mine:
            continue
        these = {str(r["question_id"]): r for r in mine}
        twice = sorted(these.keys() & found.keys())
        if twice:
            raise CompareError(
                f"agent {agent!r} played question {twice[0]!r} in more than one run "
                f"({origin[twice[0]]} and {run}): pass only the runs to compare "
                "(runs on different question sets, such as two worlds, pool)"
            )
        sources.append(str(run))
        found.update(these)
        origin.update(dict.fromkeys(these, str(run)))
    if not found:
        raise CompareError(
            f"unknown agent {agent!r} in {', '.join(map(str, runs))}: "
            f"the runs hold {', '.join(sorted(seen_agents)) or 'no finished episodes'}"
        )
    return found, sources


def _seen_in_training(runs: Sequence[str], agent: str) -> int | None:
    """Evaluated questions ``agent``'s checkpoint was trained on, over ``runs`` (each run's
    ``protocol.json``, ``agents.<agent>.seen_questions``, written by ``rag-gym evaluate``);
    ``None`` where no run says."""
    total = None
    for run in runs:
        try:
            protocol = json.loads((Path(run) / "protocol.json").read_text())
            seen = protocol["agents"][agent]["seen_questions"]["seen"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if isinstance(seen, int):
            total = (total or 0) + seen
    return total


@dataclass(frozen=True)
class MetricComparison:
    metric: str
    questions: int
    a_mean: float
    a_ci: tuple[float, float]
    b_mean: float
    b_ci: tuple[float, float]
    difference: dict[str, float | int]


def compare(
    runs: Sequence[str | Path],
    a: str,
    b: str,
    metrics: Sequence[str] = DEFAULT_METRICS,
    confidence: float = 0.95,
    n_resamples: int = 10_000,
    seed: int = 0,
) -> dict[str, Any]:
    """Agent ``a`` against agent ``b`` on the questions both finished, per metric."""
    if not runs:
        raise CompareError("expected at least one run folder")
    if a == b:
        raise CompareError(f"expected two different agents, got {a!r} twice")
    left, a_runs = _agent_scores(runs, a)
    right, b_runs = _agent_scores(runs, b)
    shared = sorted(left.keys() & right.keys())
    if not shared:
        raise CompareError(
            f"agents {a!r} and {b!r} share no question: evaluate them on the same env, split, "
            "n and seed"
        )
    rows = []
    for metric in metrics:
        key, questions = metric, shared
        if metric in CONDITIONAL_METRICS:
            key, keep = "refused", CONDITIONAL_METRICS[metric]
            if any("answerable" not in left[q] for q in shared):
                raise CompareError(
                    f"metric {metric!r} needs each episode's 'answerable' field, and these "
                    "episodes lack it: evaluate the agents again with this rag-gym"
                )
            questions = [q for q in shared if bool(left[q]["answerable"]) is keep]
            if not questions:
                kind = "answerable" if keep else "unanswerable"
                raise CompareError(
                    f"metric {metric!r} needs {kind} questions, and the shared questions have "
                    f"none: evaluate on an env with them (SynthHop-Hard, or dataset_kwargs "
                    f"unanswerable_rate > 0)"
                )
        try:
            xs = [float(left[q][key]) for q in questions]
            ys = [float(right[q][key]) for q in questions]
        except (KeyError, TypeError, ValueError):
            raise CompareError(
                f"metric {metric!r} is missing or not a number in these episodes: "
                f"pick from {', '.join(DEFAULT_METRICS + tuple(CONDITIONAL_METRICS))}"
            ) from None
        if not all(math.isfinite(v) for v in xs + ys):
            raise CompareError(f"metric {metric!r} has non-finite values")
        diff = paired_difference(xs, ys, confidence, n_resamples, seed)
        rows.append(
            MetricComparison(
                metric=metric,
                questions=len(questions),
                a_mean=sum(xs) / len(xs),
                a_ci=bootstrap_ci(xs, confidence, n_resamples, seed),
                b_mean=sum(ys) / len(ys),
                b_ci=bootstrap_ci(ys, confidence, n_resamples, seed),
                difference=diff.to_dict(),
            )
        )
    return {
        "a": {
            "agent": a,
            "runs": a_runs,
            "episodes": len(left),
            "seen_in_training": _seen_in_training(a_runs, a),
        },
        "b": {
            "agent": b,
            "runs": b_runs,
            "episodes": len(right),
            "seen_in_training": _seen_in_training(b_runs, b),
        },
        "questions": len(shared),
        "confidence": confidence,
        "n_resamples": n_resamples,
        "seed": seed,
        "metrics": [
            {
                "metric": r.metric,
                "questions": r.questions,
                "a": {"mean": r.a_mean, "low": r.a_ci[0], "high": r.a_ci[1]},
                "b": {"mean": r.b_mean, "low": r.b_ci[0], "high": r.b_ci[1]},
                "difference": r.difference,
            }
            for r in rows
        ],
    }


def comparison_markdown(result: dict[str, Any]) -> str:
    """The comparison as a Markdown table."""
    a, b = result["a"]["agent"], result["b"]["agent"]
    pct = round(100 * result["confidence"])
    lines = [
        f"{a} (a) vs {b} (b) on {result['questions']} shared questions, "
        f"{pct}% bootstrap intervals ({result['n_resamples']} resamples, seed {result['seed']})",
        "",
        f"| metric | a | b | a - b | {pct}% CI of a - b | a wins | b wins |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in result["metrics"]:
        d = row["difference"]
        name = row["metric"]
        if row.get("questions", result["questions"]) != result["questions"]:
            name += f" ({row['questions']} questions)"
        lines.append(
            f"| {name} | {row['a']['mean']:.3f} [{row['a']['low']:.3f}, "
            f"{row['a']['high']:.3f}] | {row['b']['mean']:.3f} [{row['b']['low']:.3f}, "
            f"{row['b']['high']:.3f}] | {d['mean']:+.3f} | [{d['low']:+.3f}, {d['high']:+.3f}] "
            f"| {d['wins']} | {d['losses']} |"
        )
    for side in ("a", "b"):
        seen = result[side].get("seen_in_training")
        if seen:
            lines += [
                "",
                f"Not held out: {seen} of {result[side]['agent']}'s evaluated questions are in "
                "the split its checkpoint was trained on (protocol.json, seen_questions).",
            ]
    return "\n".join(lines) + "\n"

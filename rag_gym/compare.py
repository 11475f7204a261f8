"""Compare two agents of ``rag-gym evaluate`` runs question by question.

A leaderboard's means differ from run to run by sampling alone; whether agent A beats agent B is
answered by the paired bootstrap over the questions both played
(:func:`rag_gym.stats.paired_difference`). :func:`compare` reads the ``episodes.jsonl`` of one or
more run folders (read-only: a last line cut by a kill is skipped with a warning), pairs the two
agents' episodes by question and reports, per metric, both means with their bootstrap
intervals and the interval of the paired difference. Runs on disjoint question sets (a split of
one world and the test split of a second world, whose ids carry the world's seed) pool into one
comparison; an agent that played the same question in two runs is an error.

A question is its id *under its run's protocol*: the ``protocol.json`` fields in
:data:`PAIRING_FIELDS` (env id, split, env kwargs such as the data file and ``k``, the retriever,
the corpus, the answer metric, the step limit). FlashRAG names the questions of every dataset
``test_0``, ``test_1``…, so an id alone does not say which question it is: two episodes pair only
when their runs' protocols agree on these fields. An episode whose id the other agent played only
under another protocol is an error naming both runs and the fields that differ
(``allow_mismatch=True``, ``--allow-mismatch``, pairs by id alone and records the differences).

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
from rag_gym.traces import BadLine, load_file, read_jsonl

DEFAULT_METRICS = ("em", "f1", "recall", "full_recall", "searches")
#: Refusal rates on one kind of question (the leaderboard's ``refuse|unans.`` and
#: ``refuse|ans.``): metric name -> the episodes' ``answerable`` value it keeps. A refusal
#: reward should move the first up and leave the second where it was.
CONDITIONAL_METRICS = {"refuse_unans": False, "refuse_ans": True}


#: the ``protocol.json`` fields that say what a question id names and how its episode is scored:
#: two runs' episodes pair only when these agree
PAIRING_FIELDS = (
    "env_id",
    "split",
    "env_kwargs",
    "k",
    "retriever",
    "corpus_mode",
    "corpus_size",
    "answer_metric",
    "max_episode_steps",
)


class CompareError(ValueError):
    """A run folder, agent or metric that cannot be compared (the message names the fix)."""


def run_protocol(run_dir: str | Path) -> dict[str, Any] | None:
    """The :data:`PAIRING_FIELDS` of a run's ``protocol.json`` (``None`` when the run has none;
    a damaged one is a :class:`CompareError` naming it)."""
    path = Path(run_dir) / "protocol.json"
    if not path.is_file():
        return None
    try:
        protocol = load_file(path)
    except (OSError, ValueError) as exc:
        raise CompareError(
            f"{exc}: cannot tell which questions the run played; restore the file"
        ) from None
    if not isinstance(protocol, dict):
        raise CompareError(
            f"{path}: expected a JSON object (a protocol written by rag-gym evaluate), got a "
            f"{type(protocol).__name__}; restore the file"
        )
    config = protocol.get("config") if isinstance(protocol.get("config"), dict) else {}
    return {f: protocol.get(f, config.get(f)) for f in PAIRING_FIELDS}


def _differences(x: dict[str, Any] | None, y: dict[str, Any] | None) -> list[str]:
    """The :data:`PAIRING_FIELDS` on which two runs' protocols differ, as text."""
    if x is None or y is None:
        return [] if x is y else ["protocol.json (one run has none)"]

    def show(value: Any) -> str:
        text = json.dumps(value, sort_keys=True, default=str)
        return text if len(text) <= 80 else text[:77] + "..."

    return [
        f"{f} {show(x[f])} vs {show(y[f])}"
        for f in PAIRING_FIELDS
        if json.dumps(x[f], sort_keys=True, default=str)
        != json.dumps(y[f], sort_keys=True, default=str)
    ]


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


Key = tuple[str, str]
"""A question: its run's protocol (:data:`PAIRING_FIELDS`, as JSON) and its id."""


def _agent_scores(
    runs: Sequence[str | Path], agent: str, protocols: dict[str, str]
) -> tuple[dict[Key, dict[str, Any]], list[str], dict[Key, str]]:
    """``agent``'s finished episodes by question (:data:`Key`; ``protocols`` gives each run's
    protocol key), the runs that hold them, and the run of each question."""
    found: dict[Key, dict[str, Any]] = {}
    origin: dict[Key, str] = {}  # question -> the run that played it
    sources = []
    seen_agents: set[str] = set()
    for run in runs:
        episodes = [r for r in read_episodes(run) if r.get("error") is None]
        seen_agents.update(str(r["agent"]) for r in episodes)
        mine = [r for r in episodes if r["agent"] == agent]
        if not mine:
            continue
        these = {(protocols[str(run)], str(r["question_id"])): r for r in mine}
        twice = sorted(these.keys() & found.keys())
        if twice:
            raise CompareError(
                f"agent {agent!r} played question {twice[0][1]!r} in more than one run "
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
    return found, sources, origin


def _check_pairing(
    left: dict[Key, Any],
    right: dict[Key, Any],
    origin: tuple[dict[Key, str], dict[Key, str]],
    fields: dict[str, dict[str, Any] | None],
    names: tuple[str, str],
) -> list[str]:
    """The differences between runs whose episodes would pair by question id alone and do not
    under their protocols: an episode of each agent, neither paired, with the same id."""
    by_id: dict[str, list[Key]] = {}
    for key in right:
        if key not in left:
            by_id.setdefault(key[1], []).append(key)
    found = []
    for key in left:
        if key in right:
            continue
        for other in by_id.get(key[1], []):
            runs = (origin[0][key], origin[1][other])
            diff = _differences(fields[runs[0]], fields[runs[1]])
            found.append(
                f"{names[0]!r} in {runs[0]} and {names[1]!r} in {runs[1]} played question "
                f"{key[1]!r} under different protocols ({'; '.join(diff)})"
            )
    return found


def _seen_in_training(runs: Sequence[str], agent: str) -> int | None:
    """Evaluated questions ``agent``'s checkpoint was trained on, over ``runs`` (each run's
    ``protocol.json``, ``agents.<agent>.seen_questions``, written by ``rag-gym evaluate``);
    ``None`` where no run says."""
    total = None
    for run in runs:
        try:
            protocol = load_file(Path(run) / "protocol.json")
            seen = protocol["agents"][agent]["seen_questions"]["seen"]
        except (OSError, ValueError, KeyError, TypeError, IndexError):
            continue
        if isinstance(seen, int) and not isinstance(seen, bool):
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
    allow_mismatch: bool = False,
) -> dict[str, Any]:
    """Agent ``a`` against agent ``b`` on the questions both finished, per metric.

    Episodes pair by question under their runs' protocols (see the module doc);
    ``allow_mismatch`` pairs by question id alone, and the result's ``protocol_differences``
    lists what differed."""
    if not runs:
        raise CompareError("expected at least one run folder")
    if a == b:
        raise CompareError(f"expected two different agents, got {a!r} twice")
    metrics = list(metrics)
    if not metrics:
        raise CompareError(
            "expected at least one metric, got none: pick from "
            f"{', '.join(DEFAULT_METRICS + tuple(CONDITIONAL_METRICS))}"
        )
    fields = {str(run): run_protocol(run) for run in runs}
    unknown = [run for run, f in fields.items() if f is None]
    if unknown and len(unknown) < len(fields):
        warnings.warn(
            f"{', '.join(unknown)}: no protocol.json, so their episodes pair only with runs "
            "that have none either",
            RuntimeWarning,
            stacklevel=2,
        )
    protocols = {
        run: "" if allow_mismatch else json.dumps(f, sort_keys=True, default=str)
        for run, f in fields.items()
    }
    left, a_runs, a_origin = _agent_scores(runs, a, protocols)
    right, b_runs, b_origin = _agent_scores(runs, b, protocols)
    mismatched = _check_pairing(left, right, (a_origin, b_origin), fields, (a, b))
    if mismatched:
        raise CompareError(
            f"{mismatched[0]}"
            + (f" (and {len(mismatched) - 1} more questions)" if len(mismatched) > 1 else "")
            + ": a question id means a question only within one dataset and protocol; "
            "compare runs of the same env, split, data and k, or pass --allow-mismatch "
            "(allow_mismatch=True) to pair by id alone"
        )
    shared = sorted(left.keys() & right.keys())
    if not shared:
        raise CompareError(
            f"agents {a!r} and {b!r} share no question: evaluate them on the same env, split, "
            "n and seed"
        )
    differences = sorted(
        {d for q in shared for d in _differences(fields[a_origin[q]], fields[b_origin[q]])}
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
        "protocol_differences": differences,
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
    if result.get("protocol_differences"):
        lines += [
            "",
            "Paired by question id across different protocols (--allow-mismatch): "
            + "; ".join(result["protocol_differences"]),
        ]
    for side in ("a", "b"):
        seen = result[side].get("seen_in_training")
        if seen:
            lines += [
                "",
                f"Not held out: {seen} of {result[side]['agent']}'s evaluated questions are in "
                "the split its checkpoint was trained on (protocol.json, seen_questions).",
            ]
    return "\n".join(lines) + "\n"

"""The leaderboard of a run: one row per agent (:func:`summarise`), its CSV and Markdown, the
plots, W&B, the run folder written whole (:func:`write_run`), and the table ``rag-gym evaluate``
prints (:func:`terminal_table`)."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rag_gym import health, metrics
from rag_gym.evaluate.run_folder import atomic_write, load_episodes, order_traces, protocol_text
from rag_gym.stats import bootstrap_ci

if TYPE_CHECKING:
    from rag_gym.evaluate.config import EvalResult


#: leaderboard columns: (key, header, format)
COLUMNS = (
    ("agent", "agent", "{}"),
    ("em", "EM", "{:.3f}"),
    ("em_ci", "EM 95% CI", "{}"),
    ("f1", "F1", "{:.3f}"),
    ("cover_em", "cover-EM", "{:.3f}"),
    ("sub_em", "sub-EM", "{:.3f}"),
    ("judge", "judge", "{:.3f}"),
    ("judge_missing", "judge missing", "{}"),
    ("recall", "recall", "{:.3f}"),
    ("full_recall", "full recall", "{:.3f}"),
    ("map", "mAP", "{:.3f}"),
    ("searches", "searches", "{:.2f}"),
    ("steps", "steps", "{:.2f}"),
    ("refusal_unanswerable", "refuse|unans.", "{:.2f}"),
    ("refusal_answerable", "refuse|ans.", "{:.2f}"),
    ("tokens", "tokens/ep", "{:.1f}"),
    ("seconds", "s/ep", "{:.3f}"),
    *((f"health_{flag}", health.LABELS[flag], "{:.2f}") for flag in health.FLAGS),
    ("bad_replies", "bad replies", "{}"),
    ("errors", "errors", "{}"),
    ("episodes", "episodes", "{}"),
)


def _sub_em(episodes: list[dict[str, Any]]) -> float:
    """Mean sub-EM (Search-R1's ``subem_check``, FlashRAG's ``acc``) of the episodes' predictions:
    0.0 for an episode without one, and left out, as cover-EM is, where cover-EM is NaN."""
    vals = [
        metrics.sub_exact_match(e["prediction"], e["answers"]) if e.get("prediction") else 0.0
        for e in episodes
        if not (isinstance(e.get("cover_em"), float) and np.isnan(e["cover_em"]))
    ]
    return float(np.mean(vals)) if vals else float("nan")


def _known(episodes: list[dict[str, Any]], key: str) -> list[Any]:
    """The episodes' values of ``key``, those missing (``None``) or NaN left out."""
    return [
        e[key]
        for e in episodes
        if e[key] is not None and not (isinstance(e[key], float) and np.isnan(e[key]))
    ]


def _em_interval(episodes: list[dict[str, Any]]) -> str | None:
    """The 95% percentile-bootstrap interval of the mean EM over questions, as ``low–high``."""
    vals = _known(episodes, "em")
    if not vals:
        return None
    low, high = bootstrap_ci(vals)
    return f"{low:.2f}–{high:.2f}"


def _judge_missing(episodes: list[dict[str, Any]]) -> int | None:
    """How many of the episodes the judge was asked about gave no verdict (``judge_error``):
    the ``judge`` column is the mean over the others. ``None`` for a run without a judge (its
    records have no ``judge_error``)."""
    if not any("judge_error" in e for e in episodes):
        return None
    return sum(e.get("judge_error") is not None for e in episodes)


def summarise(agent: str, episodes: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
    """One leaderboard row from an agent's episodes."""

    def mean(key: str, subset=None) -> float:
        vals = _known(episodes if subset is None else subset, key)
        return float(np.mean(vals)) if vals else float("nan")

    unans = [e for e in episodes if not e["answerable"]]
    ans = [e for e in episodes if e["answerable"]]
    return {
        "agent": agent,
        "em": mean("em"),
        "em_ci": _em_interval(episodes),
        "f1": mean("f1"),
        "cover_em": mean("cover_em"),
        "sub_em": _sub_em(episodes),
        "judge": mean("judge"),
        "judge_missing": _judge_missing(episodes),
        "recall": mean("recall"),
        "full_recall": mean("full_recall"),
        "map": mean("ap"),
        "searches": mean("searches"),
        "steps": mean("steps"),
        "refusal_unanswerable": mean("refused", unans) if unans else float("nan"),
        "refusal_answerable": mean("refused", ans) if ans else float("nan"),
        "tokens": float(np.mean([e["prompt_tokens"] + e["completion_tokens"] for e in episodes]))
        if episodes
        else 0.0,
        "seconds": seconds / max(len(episodes), 1),
        **{f"health_{k}": v for k, v in health.rates(e.get("health") for e in episodes).items()},
        "bad_replies": sum(e.get("bad_replies", 0) for e in episodes),
        "errors": sum(e["error"] is not None for e in episodes),
        "episodes": len(episodes),
    }


def write_partial(run_dir: Path, agents: tuple[str, ...], timing: dict[str, float]) -> None:
    """The leaderboard of the episodes in ``run_dir`` so far (after an interrupt or a fault)."""
    try:
        records = load_episodes(run_dir / "episodes.jsonl")
    except ValueError:
        return
    rows = [
        summarise(name, [r for r in records if r["agent"] == name], timing.get(name, 0.0))
        for name in agents
    ]
    write_leaderboard(run_dir, rows)


def write_leaderboard(run_dir: Path, rows: list[dict[str, Any]]) -> None:
    """``leaderboard.csv`` and ``leaderboard.md`` (each replaced atomically)."""
    import io

    keys = [c[0] for c in COLUMNS]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=keys, extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow(row)
    atomic_write(run_dir / "leaderboard.csv", buf.getvalue())
    atomic_write(run_dir / "leaderboard.md", leaderboard_markdown(rows) + "\n")


def write_run(result: EvalResult) -> None:
    """The whole run folder: protocol, episodes and their step traces in protocol order,
    leaderboard and plots."""
    d = result.run_dir
    atomic_write(d / "protocol.json", protocol_text(result.protocol))
    atomic_write(
        d / "episodes.jsonl",
        "".join(json.dumps(e, ensure_ascii=False, default=str) + "\n" for e in result.episodes),
    )
    order_traces(d, result.episodes)
    write_leaderboard(d, result.rows)
    write_plots(result.rows, d)


def write_plots(rows: list[dict[str, Any]], out: Path) -> None:
    """``em_f1.png`` (EM and F1 per agent) and ``accuracy_vs_retrievals.png`` (LWTS Fig. 1)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["agent"] for r in rows]
    em = [np.nan_to_num(r["em"]) for r in rows]
    f1 = [np.nan_to_num(r["f1"]) for r in rows]
    x = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(max(4, 1.1 * len(rows) + 2), 3.5))
    ax.bar(x - 0.2, em, 0.4, label="EM")
    ax.bar(x + 0.2, f1, 0.4, label="F1")
    ax.set_xticks(x, names, rotation=30, ha="right")
    ax.set_ylabel("score")
    ax.set_ylim(0, max(1.0, *em, *f1))
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "em_f1.png", dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(5, 4))
    for r in rows:
        ax.scatter(np.nan_to_num(r["searches"]), np.nan_to_num(r["em"]), s=40)
        ax.annotate(
            r["agent"],
            (np.nan_to_num(r["searches"]), np.nan_to_num(r["em"])),
            fontsize=8,
            xytext=(3, 3),
            textcoords="offset points",
        )
    ax.set_xlabel("mean retrievals per question")
    ax.set_ylabel("EM")
    ax.set_title("accuracy against retrieval count")
    fig.tight_layout()
    fig.savefig(out / "accuracy_vs_retrievals.png", dpi=120)
    plt.close(fig)


def log_to_wandb(result: EvalResult) -> None:
    """Log the leaderboard to W&B, offline unless ``WANDB_MODE`` says otherwise; files go under
    the run folder. Metric names are grouped by agent (``<agent>/em``…)."""
    import os

    try:
        import wandb
    except ImportError as exc:
        raise ImportError("--track needs wandb: pip install 'rag-gym[track]'") from exc
    run = wandb.init(
        project="rag-gym",
        name=result.run_dir.name,
        dir=str(result.run_dir),
        mode=os.environ.get("WANDB_MODE", "offline"),
        config=result.protocol["config"],
    )
    for row in result.rows:
        run.log(
            {
                f"{row['agent']}/{k}": v
                for k, v in row.items()
                if k != "agent" and isinstance(v, (int, float)) and not np.isnan(v)
            }
        )
    run.log(
        {
            "leaderboard": wandb.Table(
                columns=[c[0] for c in COLUMNS],
                data=[[str(row[c[0]]) for c in COLUMNS] for row in result.rows],
            )
        }
    )
    run.finish()


def format_cell(key: str, value: Any) -> str:
    fmt = next(f for k, _, f in COLUMNS if k == key)
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return "-"
    return fmt.format(value)


def leaderboard_markdown(rows: list[dict[str, Any]]) -> str:
    header = "| " + " | ".join(h for _, h, _ in COLUMNS) + " |"
    sep = "|" + "|".join("---" for _ in COLUMNS) + "|"
    lines = [header, sep]
    for row in ranked(rows):
        lines.append("| " + " | ".join(format_cell(k, row[k]) for k, _, _ in COLUMNS) + " |")
    return "\n".join(lines)


def ranked(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows best first: by EM, then F1 (a missing value last)."""
    return sorted(
        rows, key=lambda r: (-np.nan_to_num(r["em"], nan=-1), -np.nan_to_num(r["f1"], nan=-1))
    )


def health_cell(row: dict[str, Any]) -> str:
    """A row's health in one short text: its failed episodes, then the trajectory-health flags
    (:func:`rag_gym.health.summary`)."""
    flags = health.summary(row)
    if row.get("errors"):
        failed = f"{row['errors']} failed"
        return failed if flags in ("none", "-") else f"{failed}; {flags}"
    return flags


#: the terminal table's columns: (header, cell of a row, justify). The files keep every column
#: of :data:`COLUMNS`; this is what a reader needs first, in 80 terminal columns.
TERMINAL_COLUMNS = (
    ("agent", lambda r: str(r["agent"]), "left"),
    (
        "EM (95% CI)",
        lambda r: (
            format_cell("em", r["em"]) + ("" if r.get("em_ci") is None else f" ({r['em_ci']})")
        ),
        "right",
    ),
    ("F1", lambda r: format_cell("f1", r["f1"]), "right"),
    ("recall", lambda r: format_cell("recall", r["recall"]), "right"),
    ("searches", lambda r: format_cell("searches", r["searches"]), "right"),
    ("health", health_cell, "left"),
)


def terminal_table(rows: list[dict[str, Any]], title: str | None = None, width: int = 80) -> Any:
    """The leaderboard as ``rag-gym evaluate`` prints it: a ``rich`` table of
    :data:`TERMINAL_COLUMNS`, best row first, laid out for a console ``width`` characters wide
    (80 at least). The figures never wrap; an agent's name is never shortened (one too long for
    its column folds onto more lines, whole), nor is the health text (it wraps). The caption
    names the files that hold every column."""
    from rich import box
    from rich.table import Table

    cells = [[cell(row) for _, cell, _ in TERMINAL_COLUMNS] for row in ranked(rows)]
    need = [
        max([len(header), *(len(line[i]) for line in cells)])
        for i, (header, _, _) in enumerate(TERMINAL_COLUMNS)
    ]
    # each column is followed by one space of padding, and each but the last by the box's
    # separator; the agent's name and the health text share what the figures leave
    room = max(width, 80) - sum(need[1:-1]) - 2 * len(need) + 1
    health_width = min(need[-1], max(10, room - need[0]))
    agent_width = max(len("agent"), min(need[0], room - health_width))
    widths = [agent_width, *need[1:-1], health_width]
    table = Table(
        title=title,
        caption="every column: leaderboard.md, leaderboard.csv, report.html",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        padding=(0, 1, 0, 0),
    )
    for (header, _, justify), w in zip(TERMINAL_COLUMNS, widths, strict=True):
        wraps = header in ("agent", "health")
        table.add_column(header, justify=justify, width=w, no_wrap=not wraps, overflow="fold")
    for line in cells:
        table.add_row(*line)
    return table

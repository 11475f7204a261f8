"""Run folders, W&B (offline by default), TensorBoard and the PNG learning curve every training
run writes at its end."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rag_gym._names import run_name


def run_dir_for(cfg: Any, run_dir: str | Path | None = None) -> Path:
    """A run's folder: ``run_dir``, else ``cfg.run_dir``, else ``cfg.output_dir/<run name>``."""
    return Path(
        run_dir
        or cfg.run_dir
        or Path(cfg.output_dir) / run_name(cfg.env_id, cfg.exp_name, cfg.seed)
    )


def report_to(run_dir: str | Path, track: bool) -> list[str]:
    """Trainer ``report_to``: TensorBoard always; W&B with ``track``, offline unless the user set
    ``WANDB_MODE``, its files under the run folder. Never asks for a login."""
    targets = ["tensorboard"]
    os.environ["TENSORBOARD_LOGGING_DIR"] = str(Path(run_dir) / "tensorboard")
    if track:
        try:
            import wandb  # noqa: F401
        except ImportError as exc:
            raise ImportError("--track needs wandb: pip install 'rag-gym[track]'") from exc
        os.environ.setdefault("WANDB_MODE", "offline")
        os.environ.setdefault("WANDB_DIR", str(Path(run_dir)))
        os.environ.setdefault("WANDB_PROJECT", "rag-gym")
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        targets.append("wandb")
    return targets


def trainer_arguments(cfg: Any, run_dir: Path) -> dict[str, Any]:
    """The ``TrainingArguments`` every trainer run shares: the run folder and its name, a log
    row every step to :func:`report_to`'s targets, a checkpoint every ``cfg.save_steps``,
    ``cfg.seed``, and the device (a GPU in bf16 when there is one, else the CPU)."""
    import torch

    cuda = torch.cuda.is_available()
    return {
        "output_dir": str(run_dir),
        "run_name": run_dir.name,
        "logging_steps": 1,
        "save_steps": cfg.save_steps,
        "save_strategy": "steps",
        "report_to": report_to(run_dir, cfg.track),
        "seed": cfg.seed,
        "use_cpu": not cuda,
        "bf16": cuda,
    }


def rolling_mean(values: Sequence[float], window: int) -> list[float]:
    """The mean of each value and the ``window - 1`` before it (fewer at the start).

    >>> rolling_mean([1.0, 3.0, 2.0, 4.0], 2)
    [1.0, 2.0, 2.5, 3.0]
    """
    if window < 1:
        raise ValueError(f"expected window >= 1, got {window}")
    out: list[float] = []
    total = 0.0
    for i, v in enumerate(values):
        total += float(v)
        if i >= window:
            total -= float(values[i - window])
        out.append(total / min(i + 1, window))
    return out


def learning_curve(
    log_history: Sequence[dict[str, Any]] | Mapping[str, Sequence[dict[str, Any]]],
    path: str | Path,
    keys: Sequence[str],
    title: str = "",
    x_key: str = "step",
) -> Path | None:
    """Plot each of ``keys`` (those present) against ``x_key`` from a trainer's
    ``state.log_history`` (or any list of dicts) into one PNG with a panel per key; a mapping
    of names to log histories draws every run on the same panels, one colour and legend entry
    per run. A series of 20 points or more is drawn faint, with its moving mean over a tenth of
    its points on top. Returns the path, or ``None`` when no key was logged."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = dict(log_history) if isinstance(log_history, Mapping) else {"": log_history}
    present = [k for k in keys if any(k in row for log in runs.values() for row in log)]
    if not present:
        return None
    fig, axes = plt.subplots(len(present), 1, figsize=(6, 2.2 * len(present)), squeeze=False)
    for ax, key in zip(axes[:, 0], present, strict=True):
        for i, (name, log) in enumerate(runs.items()):
            xs = [row.get(x_key, j) for j, row in enumerate(log) if key in row]
            ys = [row[key] for row in log if key in row]
            window = len(xs) // 10 if len(xs) >= 20 else 1
            colour = f"C{i}"
            if window > 1:  # a noisy per-step series: draw it faint, with its moving mean on top
                mean = f"mean of {window} steps"
                ax.plot(
                    xs,
                    ys,
                    color=colour,
                    alpha=0.25 if name else 0.35,
                    linewidth=0.8,
                    label=None if name else "per step",
                )
                ax.plot(
                    xs,
                    rolling_mean(ys, window),
                    color=colour,
                    linewidth=1.8,
                    label=f"{name} ({mean})" if name else mean,
                )
            elif xs:
                ax.plot(xs, ys, color=colour, marker="o", markersize=3, label=name or None)
        if len(runs) > 1 or any(len(log) >= 20 for log in runs.values()):
            ax.legend(fontsize=7, loc="best")
        ax.set_ylabel(key, fontsize=8)
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel(x_key)
    if title:
        axes[0, 0].set_title(title, fontsize=9)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def run_log_history(run_dir: str | Path) -> list[dict[str, Any]]:
    """A training run's per-step log: ``results.json``'s ``log_history`` for a finished run, else
    the newest checkpoint's ``trainer_state.json`` (a run stopped before its end)."""
    import json

    run_dir = Path(run_dir)
    results = run_dir / "results.json"
    if results.is_file():
        return list(json.loads(results.read_text())["log_history"])
    steps = {p.name.removeprefix("checkpoint-"): p for p in run_dir.glob("checkpoint-*")}
    states = [
        steps[n] / "trainer_state.json"
        for n in sorted((n for n in steps if n.isdigit()), key=int)
        if (steps[n] / "trainer_state.json").is_file()
    ]
    if not states:
        raise FileNotFoundError(
            f"{run_dir} has no results.json and no checkpoint-*/trainer_state.json: expected the "
            "folder of a rag-gym train run (sft, grpo or dpo)"
        )
    return list(json.loads(states[-1].read_text())["log_history"])

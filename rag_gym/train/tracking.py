"""Run folders, W&B (offline by default), TensorBoard and the PNG learning curve every training
run writes at its end."""

from __future__ import annotations

import os
from collections.abc import Sequence
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
    log_history: Sequence[dict[str, Any]],
    path: str | Path,
    keys: Sequence[str],
    title: str = "",
    x_key: str = "step",
) -> Path | None:
    """Plot each of ``keys`` (those present) against ``x_key`` from a trainer's
    ``state.log_history`` (or any list of dicts) into one PNG with a panel per key.
    Returns the path, or ``None`` when no key was logged."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    present = [k for k in keys if any(k in row for row in log_history)]
    if not present:
        return None
    fig, axes = plt.subplots(len(present), 1, figsize=(6, 2.2 * len(present)), squeeze=False)
    for ax, key in zip(axes[:, 0], present, strict=True):
        xs = [row.get(x_key, i) for i, row in enumerate(log_history) if key in row]
        ys = [row[key] for row in log_history if key in row]
        window = len(xs) // 10 if len(xs) >= 20 else 1
        if window > 1:  # a noisy per-step series: draw it faint, with its moving mean on top
            ax.plot(xs, ys, alpha=0.35, linewidth=0.8, label="per step")
            ax.plot(xs, rolling_mean(ys, window), linewidth=1.8, label=f"mean of {window} steps")
            ax.legend(fontsize=7, loc="best")
        else:
            ax.plot(xs, ys, marker="o", markersize=3)
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

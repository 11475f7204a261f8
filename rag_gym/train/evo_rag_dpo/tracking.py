"""What an EVO-RAG run logs: TensorBoard (always) and W&B (``track``), the rows of its learning
curve and ``history.json``."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np


class _Tracker:
    """TensorBoard (always) and W&B (with ``track``), CleanRL's way: ``wandb.init`` with
    ``sync_tensorboard`` and one ``SummaryWriter``; plus the rows for the learning curve."""

    def __init__(self, run_dir: Path, track: bool, name: str, config: dict[str, Any]) -> None:
        from rag_gym.train.tracking import report_to

        targets = report_to(run_dir, track)
        self.wandb = None
        if "wandb" in targets:
            import os

            import wandb

            self.wandb = wandb.init(
                project=os.environ.get("WANDB_PROJECT", "rag-gym"),
                name=name,
                config=config,
                dir=str(run_dir),
                sync_tensorboard=True,
            )
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(run_dir / "tensorboard"))
        self.rows: list[dict[str, Any]] = []

    def log(self, values: dict[str, float], step: int, **row: Any) -> None:
        for key, value in values.items():
            if isinstance(value, (int, float)) and math.isfinite(value):
                self.writer.add_scalar(key, value, step)
        self.rows.append({**row, **values})

    def close(self) -> None:
        self.writer.close()
        if self.wandb is not None:
            self.wandb.finish()


def _dpo_logger(
    tracker: _Tracker, offset: int, stage: str, cycle: int, losses: list[float]
) -> Callable[[dict[str, float], int, int], None]:
    """Forward a policy epoch's logged rows: ``losses/dpo`` and ``dpo/<TRL metric>`` at the run's
    policy step; on the learning curve's x axis the epoch spreads over its cycle."""

    def log(logs: dict[str, float], step: int, steps: int) -> None:
        if "loss" not in logs:
            return
        values = {"losses/dpo": float(logs["loss"])}
        for key, value in logs.items():
            if key not in ("loss", "epoch") and isinstance(value, (int, float)):
                values[f"dpo/{key}"] = float(value)
        losses.append(values["losses/dpo"])
        tracker.log(values, offset + step, stage=stage, cycle=cycle - 1 + step / max(1, steps))

    return log


def _mean(values: Any) -> float:
    values = [float(v) for v in values]
    return float(np.mean(values)) if values else 0.0

"""Sampled training rollouts, saved every N steps in the step-trace schema of
:mod:`rag_gym.traces` (``steps.jsonl`` and ``passages.jsonl`` in the run folder, each record
with its ``train_step``), so ``rag-gym view RUN`` shows how the policy's behaviour changes
over training. With a W&B run active (``--track``), each sample is also logged as a
``wandb.Table`` (``rollouts/samples``).

The trainers attach it in one line: GRPO/DAPO through :func:`rollout_callback` (a
``TrainerCallback`` reading the episodes the rollout function played last), the EVO-RAG DPO loop
and the SFT held-out evaluation by calling the :class:`RolloutLog` on their episodes.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rag_gym import traces


class RolloutLog:
    """Save ``n`` episodes drawn (seeded) from those played at every ``every``-th step.

    Args:
        run_dir: the run folder.
        every: the interval in training steps (``0`` saves nothing but forced calls).
        n: episodes kept per saved step.
        seed: seed of the draw.
    """

    def __init__(self, run_dir: str | Path, every: int = 10, n: int = 4, seed: int = 0) -> None:
        for name, value, low in (("every", every, 0), ("n", n, 1)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"expected {name} to be an int >= {low}, got {value!r}")
        self.run_dir = Path(run_dir)
        self.every, self.n = every, n
        self.rng = random.Random(seed)
        self.saved_steps: list[int] = []

    def due(self, step: int) -> bool:
        return self.every > 0 and step % self.every == 0 and step not in self.saved_steps

    def __call__(
        self, step: int, episodes: Sequence[Any], force: bool = False, label: str = "policy"
    ) -> int:
        """Save a sample of ``episodes`` (rollout :class:`~rag_gym.train.rollout.Episode` s with
        a ``trace``) at training step ``step`` when due (or ``force``); returns how many."""
        traced = [e for e in episodes if getattr(e, "trace", None)]
        if not traced or not (force or self.due(step)):
            return 0
        picked = self.rng.sample(traced, min(self.n, len(traced)))
        with traces.TraceWriter(self.run_dir) as writer:
            for ep in picked:
                tr = ep.trace
                writer.write(
                    label,
                    tr.get("question_id"),
                    tr["steps"],
                    tr["passages"],
                    train_step=int(step),
                    question=tr.get("question"),
                    answers=tr.get("answers", []),
                    gold_ids=tr.get("gold_ids", []),
                    reward=float(ep.episode_return),
                    em=float(ep.em),
                )
        self.saved_steps.append(step)
        _wandb_table(step, picked)
        return len(picked)


def _wandb_table(step: int, episodes: Sequence[Any]) -> None:
    """Log the sample as a ``wandb.Table`` when a W&B run is active."""
    try:
        import wandb
    except ImportError:
        return
    if getattr(wandb, "run", None) is None:
        return
    rows = [
        [
            step,
            ep.trace.get("question"),
            " | ".join(ep.trace.get("answers", [])),
            float(ep.episode_return),
            float(ep.em),
            len(ep.trace["steps"]),
            json.dumps(ep.trace["steps"], ensure_ascii=False)[:20000],
        ]
        for ep in episodes
    ]
    table = wandb.Table(
        columns=["train_step", "question", "answers", "return", "em", "steps", "trace"], data=rows
    )
    wandb.log({"rollouts/samples": table}, commit=False)


def rollout_callback(log: RolloutLog, rollout: Any) -> Any:
    """A ``transformers.TrainerCallback`` saving ``rollout.episodes`` (the episodes the GRPO
    rollout function played for the step just taken) through ``log`` when due."""
    from transformers import TrainerCallback

    class SampleRollouts(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            log(int(state.global_step), getattr(rollout, "episodes", []))

    return SampleRollouts()

"""Which questions a checkpoint was trained on, and which of an evaluation's it has seen.

A held-out figure needs questions training never saw, and on SynthHop that is easy to lose
without noticing: a world is a function of its ``dataset_kwargs``, so two worlds that differ only
in ``unanswerable_rate`` share their entities and deal many of the same questions to different
splits. A model trained on one world's train split and evaluated on the other's test split has
seen part of its test set (58 of the default SynthHop-Hard world's 200 test questions are in the
train split of its 30%-unanswerable world: docs/training.md, the fourth refusal attempt).

:func:`training_sets` reads where a checkpoint's questions came from: a training run's
``config.json`` (``env_id``, ``env_kwargs``, ``split``), the run it started from (a GRPO run's
``init.json``), and a packaged checkpoint's ``rag_gym.json``. :func:`seen_questions` counts the
evaluated questions whose text is in one of those splits; ``rag-gym evaluate`` records the
count in ``protocol.json`` and warns when it is not 0 (:func:`rag_gym.evaluate.evaluate`).
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["SeenQuestionsWarning", "TrainingSet", "seen_questions", "training_sets"]


class SeenQuestionsWarning(UserWarning):
    """An evaluated question is in the split a checkpoint was trained on."""


@dataclass(frozen=True)
class TrainingSet:
    """One split a checkpoint was trained on: ``gym.make(env_id, split=split, **env_kwargs)``."""

    env_id: str
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    split: str = "train"
    source: str = ""
    """The file that says so."""

    def describe(self) -> dict[str, Any]:
        return {
            "env_id": self.env_id,
            "env_kwargs": self.env_kwargs,
            "split": self.split,
            "source": self.source,
        }


def _read(file: Path) -> dict[str, Any] | None:
    try:
        meta = json.loads(file.read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def _env_kwargs(value: Any) -> dict[str, Any]:
    if isinstance(value, str):  # a command line's JSON, as the configs may keep it
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    return dict(value) if isinstance(value, dict) else {}


def training_sets(path: str | Path, _seen: set[Path] | None = None) -> list[TrainingSet]:
    """The splits the checkpoint at ``path`` was trained on, its starting run's included.

    ``path`` is what ``search_r1:PATH`` takes: a run folder, an adapter folder inside one
    (``final/``, ``checkpoint-N/``), a ``.gguf`` adapter, or a packaged checkpoint. Its folder is
    read first, then the folder above (as :func:`~rag_gym.agents.search_r1.checkpoint_tags`).
    Empty where no file says (an adapter from elsewhere): nothing can be checked then.
    """
    seen = set() if _seen is None else _seen
    path = Path(path).expanduser()
    folder = (path.parent if path.is_file() else path).resolve()
    out: list[TrainingSet] = []
    for where in (folder, folder.parent):
        if where in seen:
            continue
        seen.add(where)
        packaged = _read(where / "rag_gym.json")
        if packaged and isinstance(packaged.get("env_id"), str):
            out.append(
                TrainingSet(
                    packaged["env_id"],
                    _env_kwargs(packaged.get("env_kwargs")),
                    str(packaged.get("train_split", "train")),
                    str(where / "rag_gym.json"),
                )
            )
        config = _read(where / "config.json")
        if config and isinstance(config.get("env_id"), str):
            out.append(
                TrainingSet(
                    config["env_id"],
                    _env_kwargs(config.get("env_kwargs")),
                    str(config.get("split") or "train"),
                    str(where / "config.json"),
                )
            )
        started = _read(where / "init.json")
        init = started.get("init") if started else None
        if isinstance(init, str) and Path(init).exists():
            out += training_sets(init, seen)
        if out:
            break
    unique: dict[str, TrainingSet] = {}
    for ts in out:
        key = json.dumps([ts.env_id, ts.env_kwargs, ts.split], sort_keys=True, default=str)
        unique.setdefault(key, ts)
    return list(unique.values())


def normal_question(text: str) -> str:
    """The form two questions are compared in: lower case, runs of white space as one space."""
    return re.sub(r"\s+", " ", str(text)).strip().lower()


def split_questions(ts: TrainingSet) -> set[str]:
    """The normalised question texts of ``ts``'s split."""
    import gymnasium as gym

    import rag_gym  # noqa: F401  (registers the envs)

    env = gym.make(ts.env_id, **{**ts.env_kwargs, "split": ts.split})
    try:
        return {normal_question(ex.question) for ex in env.unwrapped.examples}
    finally:
        env.close()


def seen_questions(checkpoint: str | Path, questions: Iterable[str]) -> dict[str, Any]:
    """How many of ``questions`` (an evaluation's question texts) the checkpoint trained on.

    Returns ``{"seen": k, "n": n, "training_sets": [...]}``, each training set with its own
    ``seen`` count; ``seen`` is ``None`` when no file says what the checkpoint was trained on,
    and a training set whose split cannot be built (a dataset file gone, a changed option) gets
    ``"error"`` and a :class:`SeenQuestionsWarning` instead of a count.
    """
    wanted = {normal_question(q) for q in questions}
    sets = training_sets(checkpoint)
    report: dict[str, Any] = {"seen": None, "n": len(wanted), "training_sets": []}
    seen: set[str] = set()
    for ts in sets:
        row = ts.describe()
        try:
            hit = wanted & split_questions(ts)
        except Exception as exc:  # a report, never a reason to stop an evaluation
            row["error"] = f"{type(exc).__name__}: {exc}"
            warnings.warn(
                f"could not check which evaluated questions {checkpoint} was trained on: its "
                f"training split ({ts.env_id} {ts.split}, from {ts.source}) did not build: "
                f"{row['error']}",
                SeenQuestionsWarning,
                stacklevel=2,
            )
        else:
            row["seen"] = len(hit)
            seen |= hit
        report["training_sets"].append(row)
    if any("seen" in row for row in report["training_sets"]):
        report["seen"] = len(seen)
    return report

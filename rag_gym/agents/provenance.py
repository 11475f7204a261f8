"""The splits a checkpoint was trained on, and how many of an evaluation's questions are in them.

A held-out figure needs questions training never saw, and that is easy to lose without
noticing: a SynthHop world is a function of its ``dataset_kwargs``, so two worlds that differ
only in ``unanswerable_rate`` share their entities and deal many of the same questions to
different splits, and a real-data file read without ``split_by_id`` is one split whatever its
label. A model trained on one world's train split and evaluated on the other's test split has
seen part of its test set.

:func:`training_sets` reads where a checkpoint's questions came from: a training run's
``config.json`` (``env_id``, ``env_kwargs``, ``split``), the run it started from (a GRPO run's
``init.json``; a run that mixed several splits lists them as ``training_sets``), and a packaged
checkpoint's ``rag_gym.json`` (its ``training_sets``, written by
:func:`rag_gym.train.ship.package_adapter`, or its ``env_id``/``env_kwargs``/``train_split``).
:func:`seen_questions` counts the evaluated questions whose text is in one of those splits;
``rag-gym evaluate`` records the count in ``protocol.json`` and warns when it is not 0
(:func:`rag_gym.evaluate.evaluate`). The count is of the split, not of the questions training
drew from it (an SFT run's ``n_demos``, a GRPO run's steps): a question of the split counts as
seen. Questions used only to choose (a validation split's held-out EM) are not counted.
"""

from __future__ import annotations

import functools
import json
import re
import warnings
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "SeenQuestionsWarning",
    "TrainingSet",
    "normal_question",
    "recorded_base",
    "recorded_chat_template",
    "recorded_template",
    "seen_questions",
    "split_questions",
    "training_sets",
]

#: How many folders above a checkpoint are searched for the record of its run (an EVO-RAG DPO
#: cycle's adapter sits two below the run's ``config.json``: ``run/<stage>/cycle<n>/``).
ANCESTORS = 3


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
        return asdict(self)


def read_record(file: Path) -> dict[str, Any] | None:
    """The JSON object in ``file``, or ``None`` where it is missing, unreadable or not an object."""
    try:
        meta = json.loads(file.read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def record_folders(path: str | Path) -> list[Path]:
    """Where a checkpoint's training record may be, nearest first: the folder of ``path`` (itself,
    or a ``.gguf`` file's folder) and up to :data:`ANCESTORS` folders above it."""
    path = Path(path).expanduser()
    folder = (path.parent if path.is_file() else path).resolve()
    return [folder, *folder.parents][: ANCESTORS + 1]


def recorded_template(path: str | Path) -> dict[str, str] | None:
    """The chat template the runs of the checkpoint at ``path`` trained with, as they recorded
    it (a checkpoint's ``rag_gym.json``, a GRPO run's ``init.json``, an SFT run's
    ``config.json``: :meth:`~rag_gym.generation.chat_templates.ChatTemplate.describe`), the
    nearest first; ``None`` where none says (a run made before templates were recorded used its
    base model's own)."""
    for where in record_folders(path):
        for name in ("rag_gym.json", "init.json", "config.json"):
            meta = read_record(where / name)
            if meta and isinstance(meta.get("chat_template"), dict):
                return meta["chat_template"]
    return None


def recorded_chat_template(path: str | Path) -> str | None:
    """:func:`recorded_template` as the ``chat_template`` option that names it again: a
    built-in's name or the file's path; ``None`` for the model's own (or no record)."""
    record = recorded_template(path) or {}
    if record.get("from") == "builtin" and isinstance(record.get("name"), str):
        return record["name"]
    if record.get("from") == "file" and isinstance(record.get("file"), str):
        return record["file"]
    return None


def recorded_base(path: str | Path) -> str | None:
    """The base model the checkpoint at ``path`` was trained on, as its record names it (a
    checkpoint's ``rag_gym.json`` ``base``, a training run's ``config.json`` ``model``, or the
    run a GRPO run started from): ``"embedded"``, a ``.gguf`` file, a hub id or a folder;
    ``None`` where no record says (an adapter from elsewhere)."""
    seen: set[Path] = set()
    todo = [path]
    while todo:
        for where in record_folders(todo.pop()):
            if where in seen:
                break
            seen.add(where)
            packaged = read_record(where / "rag_gym.json") or {}
            if isinstance(packaged.get("base"), str):
                return packaged["base"]
            config = read_record(where / "config.json") or {}
            if isinstance(config.get("model"), str) and "env_id" in config:
                return config["model"]
            started = read_record(where / "init.json") or {}
            if isinstance(started.get("init"), str):
                todo.append(started["init"])
                break
    return None


def _env_kwargs(value: Any) -> dict[str, Any]:
    if isinstance(value, str):  # a command line's JSON, as the configs may keep it
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    return dict(value) if isinstance(value, dict) else {}


def _record(meta: Any, source: str, split_key: str = "split") -> list[TrainingSet]:
    """The training set a record names (``env_id``, ``env_kwargs``, the split under
    ``split_key``, default ``train``), or none where it names no ``env_id``."""
    if not (isinstance(meta, dict) and isinstance(meta.get("env_id"), str)):
        return []
    split = str(meta.get(split_key) or "train")
    return [TrainingSet(meta["env_id"], _env_kwargs(meta.get("env_kwargs")), split, source)]


def _listed(meta: Any, source: str, split_key: str = "train_split") -> list[TrainingSet]:
    """The record's ``training_sets`` list (a run that mixed several splits), else the one
    training set it names."""
    listed = meta.get("training_sets") if isinstance(meta, dict) else None
    if isinstance(listed, list) and listed:
        rows = [row for row in listed if isinstance(row, dict)]
        return [ts for row in rows for ts in _record(row, str(row.get("source") or source))]
    return _record(meta, source, split_key=split_key)


def training_sets(path: str | Path, _seen: set[Path] | None = None) -> list[TrainingSet]:
    """The splits the checkpoint at ``path`` was trained on, its starting run's included.

    ``path`` is what ``search_r1:PATH`` takes: a run folder, an adapter folder inside one
    (``final/``, ``checkpoint-N/``, an EVO-RAG DPO ``<stage>/cycle<n>/``), a ``.gguf`` adapter,
    or a packaged checkpoint. Its folder is read first, then up to :data:`ANCESTORS` folders
    above it, until one holds a record (``rag_gym.json``, or a ``config.json`` with an
    ``env_id``). Empty where none does (an adapter from elsewhere): nothing can be checked then.
    A starting run (``init.json``) that is no longer where it was is a
    :class:`SeenQuestionsWarning` (the count then covers the run's own split only).
    """
    seen = set() if _seen is None else _seen
    out: list[TrainingSet] = []
    for where in record_folders(path):
        if where in seen:
            break
        seen.add(where)
        packaged = read_record(where / "rag_gym.json")
        if packaged:
            out += _listed(packaged, str(where / "rag_gym.json"))
        out += _listed(read_record(where / "config.json"), str(where / "config.json"), "split")
        started = read_record(where / "init.json")
        init = started.get("init") if started else None
        if isinstance(init, str):
            try:
                there = Path(init).exists()
            except OSError:
                there = False
            if there:
                out += training_sets(init, seen)
            else:
                warnings.warn(
                    f"{where / 'init.json'} says the run started from {init}, which is not "
                    "there (a run copied from another machine?): the questions that start was "
                    "trained on are not checked",
                    SeenQuestionsWarning,
                    stacklevel=2,
                )
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


def split_questions(ts: TrainingSet) -> frozenset[str]:
    """The normalised question texts of ``ts``'s split, loaded through the data layer (no
    corpus, index or retriever is built) and kept for the next checkpoint of the same split."""
    import gymnasium as gym
    from gymnasium.envs.registration import load_env_creator

    import rag_gym  # noqa: F401  (registers the envs)
    from rag_gym.envs.base import DataConfig, QAEnv

    spec = gym.spec(ts.env_id)
    env_class = (
        load_env_creator(spec.entry_point)
        if isinstance(spec.entry_point, str)
        else spec.entry_point
    )
    if not (isinstance(env_class, type) and issubclass(env_class, QAEnv)):
        raise ValueError(
            f"{ts.env_id} is not a rag-gym QAEnv ({spec.entry_point}): its questions cannot be "
            "read without building it"
        )
    fields = {**(spec.kwargs or {}), **ts.env_kwargs, "split": ts.split}
    data = DataConfig.from_kwargs(
        fields.pop("data", None), **{k: v for k, v in fields.items() if k in DataConfig.fields()}
    )
    if data.examples is not None:
        examples = list(data.examples)
    else:
        key = json.dumps(
            [data.dataset, data.split, str(data.data_path), dict(data.dataset_kwargs or {})],
            sort_keys=True,
            default=str,
        )
        examples = _load_examples(key)
    return frozenset(normal_question(ex.question) for ex in examples if env_class.keep_example(ex))


@functools.lru_cache(maxsize=8)
def _load_examples(key: str) -> tuple[Any, ...]:
    from rag_gym.data import load

    dataset, split, path, kwargs = json.loads(key)
    return tuple(load(dataset, split, path=None if path == "None" else path, **kwargs))


def seen_questions(checkpoint: str | Path, questions: Iterable[str]) -> dict[str, Any]:
    """How many of ``questions`` (an evaluation's question texts) the checkpoint trained on.

    Returns ``{"seen": k, "n": n, "training_sets": [...]}`` (``n`` questions asked, ``k`` of
    them in a training split, compared lower-cased), each training set with its own
    ``seen`` count; ``seen`` is ``None`` when no file says what the checkpoint was trained on,
    and a training set whose split cannot be built (a dataset file gone, a changed option) gets
    ``"error"`` and a :class:`SeenQuestionsWarning` instead of a count.
    """
    asked = [normal_question(q) for q in questions]
    sets = training_sets(checkpoint)
    report: dict[str, Any] = {"seen": None, "n": len(asked), "training_sets": []}
    seen: set[str] = set()
    for ts in sets:
        row = ts.describe()
        try:
            split = split_questions(ts)
            hit = {q for q in asked if q in split}
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
            row["seen"] = sum(q in hit for q in asked)
            seen |= hit
        report["training_sets"].append(row)
    if any("seen" in row for row in report["training_sets"]):
        report["seen"] = sum(q in seen for q in asked)
    return report

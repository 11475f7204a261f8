"""Read a run folder (evaluation, training, or both) into the data a report embeds.

Nothing in a run folder's content makes reading fail: a line that is not JSON, a record without
the expected fields, a missing ``steps.jsonl`` (a run written before step traces) each add a
warning naming the file and line, and the rest renders. Only a folder holding none of the files
a run writes is refused (:class:`NotARunFolder`).
"""

from __future__ import annotations

import csv
import math
import re
from pathlib import Path
from typing import Any

from rag_gym import traces

#: files whose presence makes a folder a run folder (evaluation or training)
RUN_FILES = (
    "protocol.json",
    "episodes.jsonl",
    traces.STEPS_FILE,
    "results.json",
    "history.json",
    "trainer_state.json",
)


class NotARunFolder(FileNotFoundError):
    """The folder holds none of the files ``rag-gym evaluate`` or ``rag-gym train`` write."""


def _num(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    return None


def _json_file(path: Path, warnings: list[str], kind: type | None = None) -> Any:
    """The JSON value in ``path`` (``None`` when it is missing, unreadable or, with ``kind``,
    of another type: the last two with a warning)."""
    if not path.is_file():
        return None
    try:
        value = traces.load_file(path, allow_nan=False)
    except OSError as exc:
        warnings.append(f"{path}: not readable ({exc.strerror or exc}); left out")
        return None
    except ValueError as exc:
        warnings.append(f"{exc}; left out")
        return None
    if kind is not None and not isinstance(value, kind):
        warnings.append(
            f"{path}: expected a JSON {'object' if kind is dict else 'array'}, got "
            f"{type(value).__name__}; left out"
        )
        return None
    return value


def check_run_folder(run_dir: str | Path) -> Path:
    """``run_dir`` as a path; :class:`NotARunFolder` unless it is a folder holding a run."""
    path = Path(run_dir)
    if not path.is_dir():
        raise NotARunFolder(
            f"expected a run folder (written by rag-gym evaluate or rag-gym train), got {path}, "
            "which is not a folder: pass the folder that holds episodes.jsonl"
        )
    if not any((path / f).is_file() for f in RUN_FILES) and not _trainer_states(path):
        raise NotARunFolder(
            f"expected a run folder (written by rag-gym evaluate or rag-gym train), got {path}, "
            f"which holds none of {', '.join(RUN_FILES)}: pass the run folder itself"
        )
    return path


_CHECKPOINT = re.compile(r"checkpoint-([0-9]{1,18})")


def _trainer_states(path: Path) -> list[Path]:
    """The ``checkpoint-<step>/trainer_state.json`` files, by step (other folders are not
    checkpoints: ``checkpoint-abc`` is left alone)."""
    found = []
    for p in path.glob("checkpoint-*"):
        m = _CHECKPOINT.fullmatch(p.name)
        if m and (p / "trainer_state.json").is_file():
            found.append((int(m.group(1)), p / "trainer_state.json"))
    return [p for _, p in sorted(found)]


EPISODE_FIELDS = (
    "question",
    "answers",
    "answerable",
    "prediction",
    "refused",
    "em",
    "f1",
    "gold_ids",
    "searches",
    "steps",
    "reward",
    "error",
    "health",
)


def load_run(run_dir: str | Path) -> dict[str, Any]:
    """Everything a report shows about ``run_dir`` (see :func:`rag_gym.view.build_report`)."""
    path = check_run_folder(run_dir)
    warnings: list[str] = []
    protocol = _json_file(path / "protocol.json", warnings, dict) or {}
    data: dict[str, Any] = {
        "title": path.resolve().name,
        "run_dir": str(path.resolve()),
        "protocol": {
            k: protocol.get(k)
            for k in ("env_id", "split", "seed", "n", "k", "retriever", "corpus_mode", "command")
            if k in protocol
        },
        "warnings": warnings,
    }
    episodes, records = _episodes(path, warnings)
    data["episodes"] = episodes
    data["leaderboard"] = _leaderboard(path, episodes, records, warnings)
    steps, passages = _traces(path, warnings)
    by_key = {
        (str(s.get("agent")), str(s.get("question_id"))): s for s in steps if "train_step" not in s
    }
    for e in episodes:
        s = by_key.get((e["agent"], e["question_id"]))
        if s is not None:
            e["trace"] = s["steps"]
    if episodes and (path / "episodes.jsonl").is_file() and not steps:
        warnings.append(
            f"{path / traces.STEPS_FILE}: missing (a run written before step traces): "
            "episodes show their final answer and retrieved ids only"
        )
    data["passages"] = passages
    data["train"] = _training(path, steps, warnings)
    return data


def _episodes(path: Path, warnings: list[str]) -> tuple[list[dict], list[dict]]:
    """The episodes as the page shows them, and the valid records as they are."""
    file = path / "episodes.jsonl"
    records, problems = traces.read_jsonl(file)
    warnings.extend(problems)
    out, valid = [], []
    for rec, line in records:
        if not isinstance(rec, dict) or "agent" not in rec or "question_id" not in rec:
            warnings.append(f"{file}:{line}: not an episode record (no 'agent'/'question_id')")
            continue
        valid.append(rec)
        e = {"agent": str(rec["agent"]), "question_id": str(rec["question_id"])}
        for key in EPISODE_FIELDS:
            e[key] = rec.get(key)
        for key in ("gold_ids", "answers"):  # lists, or unknown
            if not isinstance(e[key], list):
                e[key] = None
        ids = rec.get("retrieved_ids")
        e["retrieved_ids"] = ids if isinstance(ids, list) else []
        e["hops"] = len(e["gold_ids"] or [])
        e["tokens"] = sum(_num(rec.get(k)) or 0.0 for k in ("prompt_tokens", "completion_tokens"))
        for key in ("em", "f1", "reward"):
            e[key] = _num(e[key])
        out.append(e)
    return out, valid


def _leaderboard(
    path: Path, episodes: list[dict[str, Any]], records: list[dict], warnings: list[str]
) -> dict[str, Any]:
    from rag_gym.evaluate import COLUMNS, summarise

    columns = [[key, header] for key, header, _ in COLUMNS]
    rows: list[dict[str, Any]] = []
    agents = list(dict.fromkeys(e["agent"] for e in episodes))
    by_agent: dict[str, list[dict]] = {a: [] for a in agents}
    for rec in records:
        by_agent[str(rec["agent"])].append(rec)
    timing = _json_file(path / "timing.json", warnings, dict) or {}
    try:
        for a in agents:
            rows.append(summarise(a, by_agent[a], _num(timing.get(a)) or 0.0))
    except (KeyError, TypeError, ValueError, AttributeError, ArithmeticError) as exc:
        rows = _leaderboard_csv(path, warnings)
        warnings.append(
            f"{path / 'episodes.jsonl'}: records lack a leaderboard field ({exc!r}): "
            "the leaderboard is leaderboard.csv's"
        )
    if not rows and (path / "leaderboard.csv").is_file():
        rows = _leaderboard_csv(path, warnings)
    clean = [{k: (v if isinstance(v, str) else _num(v)) for k, v in r.items()} for r in rows]
    return {"columns": columns, "rows": clean}


def _leaderboard_csv(path: Path, warnings: list[str]) -> list[dict[str, Any]]:
    file = path / "leaderboard.csv"
    if not file.is_file():
        return []
    rows = []
    try:
        with open(file, encoding="utf-8", errors="replace", newline="") as f:
            table = list(csv.DictReader(f))
    except (OSError, csv.Error) as exc:
        warnings.append(f"{file}: not readable as CSV ({exc}); left out")
        return []
    for row in table:
        conv: dict[str, Any] = {}
        for k, v in row.items():
            if k == "agent":
                conv[k] = v
                continue
            try:
                conv[str(k)] = float(v)
            except (TypeError, ValueError):
                conv[str(k)] = v if isinstance(v, str) and v else None  # the EM interval, or empty
        if "agent" in conv:
            rows.append(conv)
    return rows


def _traces(path: Path, warnings: list[str]) -> tuple[list[dict], dict[str, list[str]]]:
    file = path / traces.STEPS_FILE
    records, problems = traces.read_jsonl(file)
    warnings.extend(problems)
    steps = []
    for rec, line in records:
        if not isinstance(rec, dict) or not isinstance(rec.get("steps"), list):
            warnings.append(f"{file}:{line}: not a step trace (no 'steps' list); left out")
            continue
        version = rec.get("schema_version")
        if version != traces.SCHEMA_VERSION:
            warnings.append(
                f"{file}:{line}: schema_version {version!r}, this viewer reads "
                f"{traces.SCHEMA_VERSION}; shown as far as it matches"
            )
        steps.append(rec)
    passages: dict[str, list[str]] = {}
    pfile = path / traces.PASSAGES_FILE
    precords, problems = traces.read_jsonl(pfile)
    warnings.extend(problems)
    for rec, line in precords:
        if isinstance(rec, dict) and "id" in rec:
            passages[str(rec["id"])] = [str(rec.get("title", "")), str(rec.get("text", ""))]
        else:
            warnings.append(f"{pfile}:{line}: not a passage record (no 'id'); left out")
    return steps, passages


def _training(path: Path, steps: list[dict], warnings: list[str]) -> dict[str, Any] | None:
    """The learning curve (``results.json``'s or the last checkpoint's ``log_history``, or the
    EVO-RAG loop's ``history.json`` by cycle) and the sampled rollouts (``steps.jsonl`` records
    with a ``train_step``)."""
    history = None
    results = _json_file(path / "results.json", warnings, dict)
    if isinstance(results, dict) and isinstance(results.get("log_history"), list):
        history = results["log_history"]
    elif (path / "history.json").is_file():
        rows = _json_file(path / "history.json", warnings)
        if isinstance(rows, list):
            history = [
                {**r, "step": r["cycle"]}
                for r in rows
                if isinstance(r, dict) and _num(r.get("cycle")) is not None
            ]
    states = _trainer_states(path)
    for candidate in [path / "trainer_state.json", *reversed(states)]:
        if history is not None:
            break
        state = _json_file(candidate, warnings, dict)
        if isinstance(state, dict) and isinstance(state.get("log_history"), list):
            history = state["log_history"]
    rollouts = [s for s in steps if "train_step" in s]
    if history is None and not rollouts:
        return None
    curves: dict[str, list[list[float]]] = {}
    for entry in history or []:
        if not isinstance(entry, dict) or _num(entry.get("step")) is None:
            continue
        for key, value in entry.items():
            if key in ("step", "epoch", "cycle", "stage_cycle") or _num(value) is None:
                continue
            curves.setdefault(key, []).append([entry["step"], float(value)])
    summary = {}
    if isinstance(results, dict):
        for key in ("stage", "before", "after", "eval_split", "checkpoint"):
            if key in results:
                summary[key] = results[key]
    return {"curves": curves, "rollouts": rollouts, "summary": summary}

"""The run folder of an evaluation: its name, its checks, ``protocol.json``, the episode
records in ``episodes.jsonl`` (read back by one reader, :func:`rag_gym.traces.read_jsonl`),
the step traces' order and the wall time per agent."""

from __future__ import annotations

import contextlib
import json
import os
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rag_gym import traces


def check_out_dir(out_dir: str | Path) -> Path:
    """``out_dir`` as a path; ``ValueError`` when it, or a folder above it, is a file."""
    out = Path(out_dir)
    for path in (out, *out.parents):
        if path.exists():
            if not path.is_dir():
                raise ValueError(
                    f"expected out_dir (--out) to be a folder, got {out_dir!s}, "
                    f"where {path} is a file: pass another folder"
                )
            break
    return out


def run_dir_of(out_dir: str | Path, run_name: str) -> Path:
    """The run folder ``out_dir/run_name``; ``ValueError`` unless it lies inside ``out_dir``
    (``../x`` and absolute paths elsewhere are refused)."""
    if not isinstance(run_name, str):
        raise TypeError(f"expected run_name to be a str, got {type(run_name).__name__}")
    base = Path(out_dir).resolve()
    run_dir = (base / run_name).resolve()
    if base not in run_dir.parents:
        raise ValueError(
            f"expected run_name (--run-name) to name a folder inside out_dir {str(out_dir)!r}, "
            f"got {run_name!r} ({run_dir}): pass a plain name such as 'exp1'"
        )
    return Path(out_dir) / run_dir.relative_to(base)


#: the files a run folder holds (evaluation, suite or training run) under these names, whether
#: written yet or not: no output option (``view --out``, ``compare --json``) writes over them
RUN_RECORDS = (
    "protocol.json",
    "episodes.jsonl",
    traces.STEPS_FILE,
    traces.PASSAGES_FILE,
    "timing.json",
    "leaderboard.csv",
    "leaderboard.md",
    "suite.json",
    "suite.md",
    "suite.csv",
    "prompt.txt",
    "results.json",
    "history.json",
    "trainer_state.json",
)


class OutputRefused(FileExistsError):
    """An output file (``--out``, ``--json``) that would replace a file of a run folder the
    command reads, or an existing file without ``--overwrite``; the message names the file and
    the fix."""


def check_output(
    target: str | Path,
    runs: Sequence[str | Path],
    option: str,
    overwrite: bool = False,
    ours: Callable[[Path], bool] | None = None,
) -> Path:
    """``target``, an output file of a command that reads the run folders ``runs``, checked
    before anything is written; :class:`OutputRefused` when it

    - is, or lies (through any link) in, one of ``runs`` and is a file there, or has a record
      name (:data:`RUN_RECORDS`) a run writes later: whatever ``overwrite`` says. A file that
      ``ours`` recognises as this command's own earlier output is not a record;
    - is an existing file and ``overwrite`` is false (``--overwrite`` replaces it)."""
    path = Path(target)
    resolved = path.resolve()
    exists = os.path.lexists(path)
    for run in runs:
        root = Path(run).resolve()
        if resolved != root and root not in resolved.parents:
            continue
        own = resolved.is_file() and ours is not None and ours(resolved)
        if not own and (resolved.exists() or resolved.name in RUN_RECORDS):
            raise OutputRefused(
                f"expected {option} to name a file outside the run folder {run}, got {target}, "
                f"which would replace the run's own {resolved.relative_to(root)}: "
                "pick a path outside the run folder"
            )
    if exists and not overwrite:
        raise OutputRefused(
            f"{option} {target} already exists: pass --overwrite to replace it, or pick "
            "another path"
        )
    return path


def write_atomically(path: Path, text: str, errors: str = "strict") -> None:
    """Write ``text`` to ``path`` through a new file beside it, renamed over ``path``: a reader
    sees the old file or the new one, never half of one."""
    import tempfile

    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", errors=errors, newline="") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def is_run_folder(path: Path) -> bool:
    """Whether ``path`` is a folder written by :func:`evaluate` (it holds ``protocol.json``)."""
    return (path / "protocol.json").is_file()


def read_protocol(run_dir: str | Path) -> dict[str, Any]:
    """The ``protocol.json`` of a run folder, checked to be one :func:`evaluate` writes (a
    ``config`` object with the run's settings, ``agents`` by name, the question ids); a damaged
    or foreign file is a ``ValueError`` naming it and what is wrong."""
    path = Path(run_dir) / "protocol.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found: expected a run folder written by rag-gym evaluate"
        )
    try:
        protocol = traces.loads(path.read_bytes())
    except ValueError as exc:
        raise ValueError(
            f"{path} is not valid JSON ({str(exc)[:200]}): the file is damaged"
        ) from None
    problems = []
    if not isinstance(protocol, dict):
        problems.append(f"a {type(protocol).__name__} instead of an object")
        protocol = {}
    config = protocol.get("config")
    if not isinstance(config, dict):
        problems.append("no 'config' object")
    else:
        for key, kind in (("env_id", str), ("split", str), ("n", int), ("seed", int)):
            if not isinstance(config.get(key), kind):
                problems.append(f"config.{key} {config.get(key)!r}")
        agents = config.get("agents")
        if not isinstance(agents, list) or not all(isinstance(a, str) for a in agents):
            problems.append(f"config.agents {str(agents)[:80]} (expected a list of names)")
        if not isinstance(config.get("env_kwargs", {}), dict):
            problems.append("config.env_kwargs that is not an object")
    if not isinstance(protocol.get("agents", {}), dict):
        problems.append(
            f"agents as a {type(protocol['agents']).__name__} (expected an object by name)"
        )
    if not isinstance(protocol.get("question_ids", []), list):
        problems.append("question_ids that is not a list")
    if problems:
        raise ValueError(
            f"{path}: expected a protocol written by rag-gym evaluate, got one with "
            + "; ".join(problems)
            + ": the file is damaged or was edited; restore it, or start a new run"
        )
    return protocol


def atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8", newline="") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_episodes(path: Path) -> list[dict[str, Any]]:
    """The records of an ``episodes.jsonl`` (none when it is missing), read by
    :func:`rag_gym.traces.read_jsonl` under its ``repair`` policy.

    A last line cut by a kill (no newline and not valid JSON) is trimmed from the file, with a
    warning: its episode is played again. Any other bad line is a ``ValueError`` naming it."""
    try:
        records, problems = traces.read_jsonl(
            path, "repair", keys=("agent", "question_id"), what="an episode record"
        )
    except traces.BadLine as exc:
        raise ValueError(
            f"{exc}; the file is damaged: delete that line, or start over with --overwrite"
        ) from None
    for problem in problems:
        warnings.warn(f"{problem}; that episode is played again", RuntimeWarning, stacklevel=2)
    return [rec for rec, _ in records]


def _normal(value: Any) -> Any:
    """``value`` as it reads back from JSON (tuples become lists)."""
    return json.loads(json.dumps(value, default=str))


def check_resumable(saved: dict[str, Any], protocol: dict[str, Any], run_dir: Path) -> None:
    """``ValueError`` unless ``protocol`` is ``saved``'s with, at most, agents added."""
    problems = []
    for key in ("env_id", "split", "seed", "n", "env_kwargs"):
        was, now = saved["config"].get(key), protocol["config"].get(key)
        if _normal(was) != _normal(now):
            problems.append(f"{key} {now!r} (the run has {was!r})")
    if saved.get("question_ids") != protocol["question_ids"] and not problems:
        problems.append("other questions (the dataset changed since the run started)")
    was, now = saved.get("lm_spec"), protocol["lm_spec"]
    if was is not None and was != now:  # a run without LM agents may get some
        problems.append(f"lm {now!r} (the run has {was!r})")
    judged, judge = saved.get("judge"), protocol.get("judge")
    if bool(judged) != bool(judge):
        problems.append("a judge" if judge else "no judge (the run has one)")
    elif isinstance(judged, str) and isinstance(judge, str) and judged != judge:
        problems.append(f"the judge {judge} (the run's is {judged})")
    saved_agents = saved.get("agents") or {}
    missing = [a for a in saved_agents if a not in protocol["agents"]]
    if missing:
        problems.append(f"no {', '.join(missing)} (the run has them; agents can only be added)")
    for name, desc in saved_agents.items():
        now = protocol["agents"].get(name)
        if now is not None:  # what a checkpoint trained on is a report, not a setting
            now, desc = ({k: v for k, v in d.items() if k != "seen_questions"} for d in (now, desc))
            now, desc = _same_template(now, desc)
        if now is not None and _normal(now) != _normal(desc):
            problems.append(f"agent {name} as {now} (the run has {desc})")
    if problems:
        raise ValueError(
            f"cannot resume {run_dir}: its protocol differs; this run asks for "
            + "; ".join(problems)
            + ". Resume with the run's own settings (rag-gym evaluate --resume RUN alone), "
            "or start a new run"
        )


def _same_template(now: dict[str, Any], saved: dict[str, Any]) -> tuple[dict, dict]:
    """An agent's descriptions now and in the run, with the chat template left out of both
    when it is the same (:func:`~rag_gym.generation.chat_templates.same_template`: a run made
    before templates were recorded used the model's own)."""
    from rag_gym.generation.chat_templates import same_template

    lm_now, lm_saved = now.get("lm"), saved.get("lm")
    if not (isinstance(lm_now, dict) and isinstance(lm_saved, dict)):
        return now, saved
    if not same_template(lm_saved.get("chat_template"), lm_now.get("chat_template")):
        return now, saved
    drop = ({k: v for k, v in lm.items() if k != "chat_template"} for lm in (lm_now, lm_saved))
    lm_now, lm_saved = drop
    return {**now, "lm": lm_now}, {**saved, "lm": lm_saved}


def protocol_text(protocol: dict[str, Any]) -> str:
    return json.dumps(protocol, indent=2, default=str) + "\n"


def read_timing(run_dir: Path) -> dict[str, float]:
    try:
        saved = traces.load_file(run_dir / "timing.json")
        return {str(k): float(v) for k, v in saved.items()}
    except (OSError, ValueError, TypeError, AttributeError, OverflowError):
        return {}  # only the s/ep column depends on it


def save_timing(run_dir: Path, timing: dict[str, float], current: dict[str, Any]) -> None:
    """Add the playing agent's time so far to ``timing`` and save it (``timing.json``)."""
    if current:
        timing[current["name"]] = current["prior"] + time.perf_counter() - current["t0"]
    atomic_write(run_dir / "timing.json", json.dumps(timing) + "\n")


def order_traces(run_dir: Path, episodes: list[dict[str, Any]]) -> None:
    """Rewrite ``steps.jsonl`` with one trace per episode, in the episodes' order (a resumed
    run may hold a trace twice: the last one is its episode's). Episodes without a trace (a
    run folder written before traces existed) stay without one."""
    path = run_dir / traces.STEPS_FILE
    if not path.is_file():
        return
    latest: dict[tuple[Any, Any], str] = {}
    for rec, _ in traces.read_jsonl(path)[0]:
        if isinstance(rec, dict):
            latest[(rec.get("agent"), rec.get("question_id"))] = json.dumps(rec, ensure_ascii=False)
    keys = [(e["agent"], e["question_id"]) for e in episodes]
    atomic_write(path, "".join(latest[k] + "\n" for k in keys if k in latest))

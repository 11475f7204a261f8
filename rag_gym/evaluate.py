"""Evaluate agents on an environment under one pinned protocol and build a leaderboard.

Every agent plays the *same* sampled questions: ``n`` question ids drawn without replacement by
``numpy.random.default_rng(seed)`` from the split, in index order. Agents that play another env
kind (R²AG's tree, ARENA's reader) play the same questions on the same dataset's env of their
kind (the reader skips unanswerable questions, which ARENA's setting does not have; the tree
env runs with ``prune="none"``, since no gold is known at test time). Episodes run ``batch_size``
at a time: each agent step is one batched call for all running episodes, or, with a backend that
batches concurrent callers (transformers), each episode goes on as soon as its own reply is done
(see :func:`run_agent`).

The run folder gets ``protocol.json`` (everything needed to re-run: dataset, split, question
ids, seed, env kwargs, retriever, k, corpus mode, model and backend spec, prompt versions,
command), ``episodes.jsonl``, the step traces ``steps.jsonl`` and ``passages.jsonl`` (every
step of every episode and each passage touched, once; schema in :mod:`rag_gym.traces`),
``leaderboard.csv``, ``leaderboard.md`` and two plots (``em_f1.png``: EM and F1 per agent;
``accuracy_vs_retrievals.png``: EM against the mean number of searches, as LWTS Figure 1).
``rag-gym evaluate`` then writes ``report.html`` (:mod:`rag_gym.view`).

Nothing finished is lost: ``protocol.json`` is written before the first episode, and each episode
is appended to ``episodes.jsonl`` (and flushed) as soon as it ends, its trace just before. A
failing episode (an agent or backend error, an env error in ``reset`` or ``step``, text that is
not valid Unicode) is recorded with its ``error`` and the run goes on; an ``OSError`` from the env
(an unreachable retrieval server, a missing file) and a ``ConnectionError`` from the agent's
backend (an LLM server that cannot be reached) stop the run, as Ctrl-C or SIGTERM do
(:class:`RunInterrupted`). A stopped run has a partial leaderboard and goes on with
``evaluate(..., resume=True)`` (``rag-gym evaluate --resume RUN``): only the missing episodes
are played, and those that failed for a reason outside the agent (:func:`replayable`: a
backend that timed out, say), each with the seed it would have had, so the final leaderboard is
the one an uninterrupted run writes. A run folder is never replaced silently: an existing one
needs ``resume`` or ``overwrite``, and ``overwrite`` deletes only a folder holding a
``protocol.json``.
"""

from __future__ import annotations

import builtins
import contextlib
import csv
import json
import os
import re
import secrets
import shutil
import signal
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import gymnasium as gym
import numpy as np

import rag_gym
from rag_gym import metrics, traces
from rag_gym.agents.base import Agent
from rag_gym.baselines import agent_class, check_agent_name
from rag_gym.stats import bootstrap_ci

#: leaderboard columns: (key, header, format)
COLUMNS = (
    ("agent", "agent", "{}"),
    ("em", "EM", "{:.3f}"),
    ("em_ci", "EM 95% CI", "{}"),
    ("f1", "F1", "{:.3f}"),
    ("cover_em", "cover-EM", "{:.3f}"),
    ("sub_em", "sub-EM", "{:.3f}"),
    ("judge", "judge", "{:.3f}"),
    ("recall", "recall", "{:.3f}"),
    ("full_recall", "full recall", "{:.3f}"),
    ("map", "mAP", "{:.3f}"),
    ("searches", "searches", "{:.2f}"),
    ("steps", "steps", "{:.2f}"),
    ("refusal_unanswerable", "refuse|unans.", "{:.2f}"),
    ("refusal_answerable", "refuse|ans.", "{:.2f}"),
    ("tokens", "tokens/ep", "{:.1f}"),
    ("seconds", "s/ep", "{:.3f}"),
    ("bad_replies", "bad replies", "{}"),
    ("errors", "errors", "{}"),
    ("episodes", "episodes", "{}"),
)
#: the env id suffix of each agent kind ("text" agents play the search env through TextActions)
_SUFFIX = {"search": "", "text": "", "tree": "-Tree", "reader": "-Reader"}


@dataclass
class EvalConfig:
    """What to evaluate and how."""

    env_id: str = "rag_gym/SynthHop-v0"
    """A registered rag-gym env id (its dataset and options apply to every agent)."""
    split: str = "validation"
    """The split to draw questions from."""
    n: int = 100
    """Questions to sample (all of them when the split is smaller)."""
    seed: int = 0
    """Seed of the question sample, of env resets and of stochastic agents."""
    agents: tuple[str, ...] = ("naive_rag", "random", "search_r1:synthhop")
    """Agent names (see :mod:`rag_gym.baselines`; ``search_r1:synthhop`` is the shipped trained
    agent)."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra ``gym.make`` kwargs (``data_path``, ``corpus``, ``index``, ``k``…); plain JSON values."""
    batch_size: int = 8
    """Episodes stepped together (one batched agent call per step)."""
    lm_spec: str | None = None
    """The backend spec (``llama_cpp``, ``openai:model@url``…), recorded for re-runs."""
    out_dir: str = "runs"
    """Parent folder of the run folder."""
    run_name: str | None = None
    """Run folder name, a folder inside ``out_dir`` (default, unique and sortable:
    ``<env>__<split>__<seed>__<unix time>.<microseconds>-<random hex>``)."""

    def __post_init__(self) -> None:
        if not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"expected n >= 1, got {self.n!r}")
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ValueError(f"expected batch_size >= 1, got {self.batch_size!r}")
        if not self.agents:
            raise ValueError("expected at least one agent, got none")
        self.agents = tuple(check_agent_name(a) for a in self.agents)
        if self.env_id not in gym.registry:
            import difflib

            ids = [i for i in gym.registry if i.startswith("rag_gym/")]
            close = difflib.get_close_matches(self.env_id, ids, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(
                f"expected a registered env id (rag-gym envs lists them), got {self.env_id!r}{hint}"
            )
        if not isinstance(self.env_kwargs, dict):
            raise TypeError(
                f"expected env_kwargs to be a dict (a JSON object), got "
                f"{type(self.env_kwargs).__name__}"
            )
        if "split" in self.env_kwargs and self.env_kwargs["split"] != self.split:
            raise ValueError(
                f"expected the split once, got split {self.split!r} and env_kwargs split "
                f"{self.env_kwargs['split']!r}: the questions come from split (--split); drop "
                "'split' from env_kwargs (--env-kwargs)"
            )
        check_out_dir(self.out_dir)
        if self.run_name is not None:
            run_dir_of(self.out_dir, self.run_name)

    @classmethod
    def from_run(cls, run_dir: str | Path, **overrides: Any) -> EvalConfig:
        """The config saved in a run folder's ``protocol.json`` (to reproduce the run)."""
        saved = dict(read_protocol(run_dir)["config"])
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(saved) - names)
        if unknown:
            raise ValueError(
                f"{Path(run_dir) / 'protocol.json'}: its config has fields this rag-gym does not "
                f"know ({', '.join(unknown)}); run it with the rag-gym version that wrote it"
            )
        saved["agents"] = tuple(saved["agents"])
        return cls(**{**saved, **overrides})


@dataclass
class EvalResult:
    config: EvalConfig
    run_dir: Path
    rows: list[dict[str, Any]]
    episodes: list[dict[str, Any]]
    protocol: dict[str, Any]


#: errors of the machine, not of the agent or the question: an episode recorded with one is
#: played again by a resumed run
_OUTSIDE_ERRORS = frozenset(
    name
    for name, value in vars(builtins).items()
    if isinstance(value, type) and issubclass(value, (OSError, MemoryError))
)


def replayable(record: dict[str, Any]) -> bool:
    """Whether an episode record failed for a reason outside the agent and the question (an
    ``OSError`` such as a backend's ``TimeoutError`` or ``ConnectionError``, or a
    ``MemoryError``), so that a resumed run plays it again."""
    error = record.get("error")
    return isinstance(error, str) and error.split(":", 1)[0].strip() in _OUTSIDE_ERRORS


class RunInterrupted(KeyboardInterrupt):
    """A run stopped by Ctrl-C or SIGTERM. Every finished episode is in ``run_dir``
    (``episodes.jsonl``), with a partial leaderboard; ``evaluate(..., resume=True)`` goes on.

    A ``KeyboardInterrupt``, so that code which catches ``Exception`` still stops."""

    def __init__(self, run_dir: Path, saved: int, new: int, reason: str) -> None:
        super().__init__(
            f"{reason}: {saved} finished episodes ({new} of them this session) are saved in "
            f"{run_dir}; resume with evaluate(..., resume=True) (rag-gym evaluate --resume RUN)"
        )
        self.run_dir, self.saved, self.new, self.reason = run_dir, saved, new, reason


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """While the block runs, SIGTERM raises ``KeyboardInterrupt("SIGTERM")``, as Ctrl-C raises
    ``KeyboardInterrupt``, so :func:`evaluate` saves a partial leaderboard before the process
    ends. Does nothing outside the main thread (signal handlers live there)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def make_env(env_id: str, kwargs: dict[str, Any], agent: Agent | None = None) -> gym.Env:
    """Every env the evaluator builds, ``agent``'s own included (the one place to wrap them).

    ``reward_preset`` / ``reward_kwargs`` among ``kwargs`` put that paper's reward stack around
    the env (:func:`rag_gym.wrappers.presets.make`). A ``"text"`` agent (``search_r1``) plays the
    search env through :class:`~rag_gym.wrappers.TextActions` with its own tag preset."""
    from rag_gym.wrappers.presets import make as make_with_preset

    env = make_with_preset(env_id, **kwargs)
    if agent is not None and agent.env_kind == "text":
        from rag_gym.wrappers.text_actions import TextActions

        env = TextActions(env, tags=agent.tags)
    return env


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


def default_run_name(config: EvalConfig) -> str:
    """``<env>__<split>__<seed>__<unix time>.<microseconds>-<random hex>``: sorts by start time,
    and two runs started in the same microsecond still differ."""
    t = time.time_ns()
    stamp = f"{t // 10**9}.{t // 1000 % 10**6:06d}-{secrets.token_hex(2)}"
    return f"{config.env_id.split('/')[-1]}__{config.split}__{config.seed}__{stamp}"


def is_run_folder(path: Path) -> bool:
    """Whether ``path`` is a folder written by :func:`evaluate` (it holds ``protocol.json``)."""
    return (path / "protocol.json").is_file()


def check_run_dir(config: EvalConfig, resume: bool = False, overwrite: bool = False) -> Path | None:
    """Check, before anything slow, that ``config``'s run folder may be used; return it (``None``
    for a default name, made unique when the run starts).

    A new or empty folder is used as it is; an existing run folder needs ``resume`` (go on) or
    ``overwrite`` (start over); any other existing folder is refused."""
    if resume and overwrite:
        raise ValueError("expected resume or overwrite, got both: pick one")
    if config.run_name is None:
        if resume:
            raise ValueError(
                "expected the name of the run to resume, got none: pass run_name (--resume RUN)"
            )
        return None
    run_dir = run_dir_of(config.out_dir, config.run_name)
    if run_dir.exists() and not run_dir.is_dir():
        raise ValueError(f"expected {run_dir} to be a run folder, got a file: pick another name")
    used = run_dir.is_dir() and any(run_dir.iterdir())
    if resume:
        if not is_run_folder(run_dir):
            raise FileNotFoundError(
                f"expected a run folder to resume at {run_dir}, but it has no protocol.json: "
                "check the path, or drop --resume to start a new run"
            )
    elif used and not is_run_folder(run_dir):
        raise FileExistsError(
            f"{run_dir} exists and is not a rag-gym run folder (no protocol.json): "
            "pick another --run-name or --out; it is never deleted"
        )
    elif used and not overwrite:
        raise FileExistsError(
            f"{run_dir} already holds a run: pass --resume {run_dir} to go on with it, "
            "--overwrite to replace it, or another --run-name"
        )
    return run_dir


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
        protocol = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
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


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8", newline="") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_episodes(path: Path) -> list[dict[str, Any]]:
    """The records of an ``episodes.jsonl`` (none when it is missing).

    A last line cut by a kill (no newline and not valid JSON) is trimmed from the file, with a
    warning: its episode is played again. Any other bad line is a ``ValueError`` naming it."""
    if not path.is_file():
        return []
    data = path.read_bytes()
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" when the file ends with a newline
    records = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(
                f"{path}:{i}: expected an episode record (a JSON object), got {line[:80]!r} "
                f"({exc}); the file is damaged: delete that line, or start over with --overwrite"
            ) from None
        if not isinstance(rec, dict) or not {"agent", "question_id"} <= rec.keys():
            raise ValueError(
                f"{path}:{i}: expected an episode record with 'agent' and 'question_id', "
                f"got {line[:80]!r}: delete that line, or start over with --overwrite"
            )
        records.append(rec)
    if tail.strip():
        try:
            rec = json.loads(tail)
            ok = isinstance(rec, dict) and {"agent", "question_id"} <= rec.keys()
        except (json.JSONDecodeError, UnicodeDecodeError):
            ok = False
        with open(path, "r+b") as f:
            if ok:  # complete but for its newline
                records.append(rec)
                f.seek(0, os.SEEK_END)
                f.write(b"\n")
            else:
                f.truncate(len(data) - len(tail))
        if not ok:
            warnings.warn(
                f"{path}: its last line was cut off (the run was killed while writing it); "
                f"dropped it ({len(tail)} bytes), that episode is played again",
                RuntimeWarning,
                stacklevel=2,
            )
    return records


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
    if bool(saved.get("judge")) != bool(protocol.get("judge")):
        problems.append("a judge" if protocol.get("judge") else "no judge (the run has one)")
    saved_agents = saved.get("agents") or {}
    missing = [a for a in saved_agents if a not in protocol["agents"]]
    if missing:
        problems.append(f"no {', '.join(missing)} (the run has them; agents can only be added)")
    for name, desc in saved_agents.items():
        now = protocol["agents"].get(name)
        if now is not None:  # what a checkpoint trained on is a report, not a setting
            now, desc = ({k: v for k, v in d.items() if k != "seen_questions"} for d in (now, desc))
        if now is not None and _normal(now) != _normal(desc):
            problems.append(f"agent {name} as {now} (the run has {desc})")
    if problems:
        raise ValueError(
            f"cannot resume {run_dir}: its protocol differs; this run asks for "
            + "; ".join(problems)
            + ". Resume with the run's own settings (rag-gym evaluate --resume RUN alone), "
            "or start a new run"
        )


def sample_indices(n_questions: int, n: int, seed: int) -> list[int]:
    """The pinned question sample: ``n`` sorted indices drawn by ``default_rng(seed)``."""
    if n >= n_questions:
        return list(range(n_questions))
    rng = np.random.default_rng(seed)
    return sorted(int(i) for i in rng.choice(n_questions, size=n, replace=False))


def env_id_for(base_id: str, kind: str) -> str:
    """The same dataset's env id of another kind (``rag_gym/X-v0`` → ``rag_gym/X-Tree-v0``)."""
    stem = base_id.split("/", 1)[1].rsplit("-v", 1)[0]
    for suffix in ("-Tree", "-Reader"):
        stem = stem.removesuffix(suffix)
    env_id = f"rag_gym/{stem}{_SUFFIX[kind]}-v0"
    if env_id not in gym.registry:
        raise ValueError(f"{base_id}'s dataset has no {kind} env ({env_id} is not registered)")
    return env_id


def _episode_record(
    kind: str,
    start_info: dict,
    info: dict,
    actions: list[str],
    reward: float,
    terminated: bool,
    truncated: bool,
    example,
    error: str | None,
) -> dict[str, Any]:
    gold = list(start_info.get("gold_ids", []))
    nan = float("nan")
    if kind == "reader":
        scores = info.get("scores") or {"em": 0.0, "f1": 0.0, "cover_em": 0.0}
        refs, predicted = set(info.get("gold_references", [])), info.get("relevance", [])
        recall = len(refs & set(predicted)) / len(refs) if refs else None
        retrieved: list[str] = []
        full = float(refs.issubset(predicted)) if refs else None
        ap = (
            metrics.average_precision([str(r) for r in predicted], [str(r) for r in refs])
            if refs
            else None
        )
        searches = 0
    else:
        retrieved = list(info.get("retrieved_history", []))
        scores = info.get("scores") or (
            {"em": 0.0, "f1": 0.0, "cover_em": 0.0}
            if kind in ("search", "text")
            else {"em": nan, "f1": nan, "cover_em": nan}
        )
        recall = metrics.recall_at_k(retrieved, gold) if gold else None
        full = metrics.full_recall(retrieved, gold) if gold else None
        ap = metrics.average_precision(retrieved, gold) if gold else None
        searches = info.get("num_searches", info.get("num_branches", 0))
    return {
        "question_id": start_info["question_id"],
        "question": start_info["question"],
        "answers": list(example.answers),
        "answerable": example.answerable,
        "prediction": info.get("prediction"),
        "refused": bool(actions and actions[-1] == "REFUSE"),
        "em": scores["em"],
        "f1": scores["f1"],
        "cover_em": scores["cover_em"],
        "judge": None,
        "gold_ids": gold,
        "retrieved_ids": retrieved,
        "recall": recall,
        "full_recall": full,
        "ap": ap,
        "searches": searches,
        "steps": info.get("step", len(actions)),
        "actions": actions,
        "reward": reward,
        "terminated": terminated,
        "truncated": truncated,
        "error": error,
    }


def _failed_record(kind: str, qid: str, example: Any, error: str) -> dict[str, Any]:
    """The record of an episode that failed before it started (``reset`` raised)."""

    try:
        list(example.answers), bool(example.answerable)
    except Exception:  # a record broken in any way: no answers known
        example = SimpleNamespace(answers=[], answerable=True)
    question = getattr(example, "question", None)
    rec = _episode_record(
        kind,
        {"question_id": qid, "question": question if isinstance(question, str) else None},
        {},
        [],
        0.0,
        False,
        False,
        example,
        error,
    )
    rec.update(prompt_tokens=0, completion_tokens=0, bad_replies=0)
    return rec


def run_agent(
    env_id: str,
    env_kwargs: dict[str, Any],
    agent: Agent,
    question_ids: list[str],
    seed: int,
    batch_size: int,
    progress: Callable[[int], None] | None = None,
    orders: list[int] | None = None,
    on_episode: Callable[[dict[str, Any]], None] | None = None,
    trace: bool = False,
) -> tuple[list[dict[str, Any]], float]:
    """Play ``agent`` on every question, ``batch_size`` episodes at a time.

    When the agent's language model batches concurrent callers (``lm.concurrent_clients``, the
    transformers backend), each of the ``batch_size`` slots plays its episodes on its own and
    the model keeps their requests in one running batch (``lm.run_clients``, one session per
    agent): a slot whose reply is done steps its env and sends its next prompt while the others
    are still generating. Otherwise every agent step is one batched call for all running
    episodes, and a step waits for its slowest reply.

    Question ``question_ids[i]`` is episode ``orders[i]`` of the protocol (default ``i``), which
    fixes its seed: a resumed run plays the missing episodes as the first run would have.
    ``on_episode(record)`` is called as each episode ends (the evaluator appends it to the run
    folder there).

    With ``trace``, each record also holds ``"trace"``: ``{"steps": [...], "passages": {...}}``,
    its step trace and the passages it touched (retrieved or gold) in the schema of
    :mod:`rag_gym.traces`.

    Returns the episode records (in question order) and the wall time. An agent or backend
    exception ends the episodes of that call as failed episodes (``error`` set), and so does an
    env exception in ``reset`` or ``step`` (a bad record, an action outside the space); the run
    goes on. An ``OSError`` from the env (retrieval server unreachable) and a
    ``ConnectionError`` from the agent (its LLM server cannot be reached) are raised: every
    episode would fail alike, and the run is to be resumed once the cause is fixed.
    """
    kind = agent.env_kind
    if orders is None:
        orders = list(range(len(question_ids)))
    if len(orders) != len(question_ids):
        raise ValueError(
            f"expected one order per question, got {len(orders)} for {len(question_ids)}"
        )
    n_slots = max(1, min(batch_size, len(question_ids)))
    envs = [make_env(env_id, env_kwargs, agent) for _ in range(n_slots)]
    by_id = {ex.id: ex for ex in envs[0].unwrapped.examples}
    queue = list(zip(orders, question_ids, strict=True))
    records: dict[int, dict[str, Any]] = {}
    active: dict[int, dict[str, Any]] = {}
    done_count = 0
    t0 = time.perf_counter()

    def record(order: int, rec: dict[str, Any]) -> None:
        nonlocal done_count
        records[order] = rec
        done_count += 1
        if on_episode is not None:
            on_episode(rec)
        if progress is not None:
            progress(done_count)

    def start(slot: int) -> None:
        """Start the next queued episode in ``slot``; one whose reset fails is recorded."""
        while queue:
            order, qid = queue.pop(0)
            episode_seed = seed * 1_000_003 + order
            t_start = time.perf_counter()
            try:
                obs, info = envs[slot].reset(seed=episode_seed, options={"question_id": qid})
            except OSError:
                raise
            except Exception as exc:  # a bad record must not end the run
                # an env whose reset raised is in no known state (Gymnasium's env checker
                # keeps a half-done first reset): this slot gets a new one
                envs[slot].close()
                envs[slot] = make_env(env_id, env_kwargs, agent)
                rec = _failed_record(kind, qid, by_id.get(qid), f"{type(exc).__name__}: {exc}")
                rec["seconds"] = time.perf_counter() - t_start
                record(order, rec)
                continue
            agent.reset(episode_seed, slot)
            active[slot] = {
                "order": order,
                "obs": obs,
                "info": info,
                "start_info": info,
                "actions": [],
                "reward": 0.0,
                "terminated": False,
                "truncated": False,
                "t0": t_start,
                "steps": [],
                "passages": {},
                "tokens": (0, 0),
            }
            return

    def finish(slot: int, error: str | None = None) -> None:
        st = active.pop(slot)
        example = envs[slot].unwrapped.current_example
        rec = _episode_record(
            kind,
            st["start_info"],
            st["info"],
            st["actions"],
            st["reward"],
            st["terminated"],
            st["truncated"],
            example,
            error,
        )
        rec["prompt_tokens"] = agent.usage_of(slot)["prompt_tokens"]
        rec["completion_tokens"] = agent.usage_of(slot)["completion_tokens"]
        rec["bad_replies"] = agent.usage_of(slot).get("bad_replies", 0)
        rec["seconds"] = time.perf_counter() - st["t0"]
        if trace:
            gold = rec["gold_ids"]
            missing = [g for g in gold if g not in st["passages"]]
            st["passages"].update(traces.passages_of({}, _corpus_of(envs[slot]), missing))
            rec["trace"] = {"steps": st["steps"], "passages": st["passages"]}
        record(st["order"], rec)

    def step(slot: int, action: Any) -> None:
        st = active[slot]
        raw = agent.take_raw_output(slot)
        try:
            obs, reward, terminated, truncated, info = envs[slot].step(action)
        except OSError:
            raise
        except Exception as exc:  # an action outside the env's space, or an env fault
            if trace:
                _trace_step(slot, st, action, {"message": f"{type(exc).__name__}: {exc}"}, 0.0, raw)
            finish(slot, f"{type(exc).__name__}: {exc}")
            return
        if trace:
            _trace_step(slot, st, action, info, reward, raw)
        st.update(obs=obs, info=info, terminated=terminated, truncated=truncated)
        st["reward"] += float(reward)
        st["actions"].append(info.get("action_type") or kind.upper())
        if terminated or truncated:
            finish(slot)

    def _trace_step(slot, st, action, info, reward, raw) -> None:
        usage = agent.usage_of(slot)
        pt, ct = usage["prompt_tokens"], usage["completion_tokens"]
        step_rec = traces.step_record(
            len(st["steps"]) + 1,
            action,
            info,
            reward,
            st["start_info"].get("gold_ids", []),
            raw,
            pt - st["tokens"][0],
            ct - st["tokens"][1],
        )
        st["tokens"] = (pt, ct)
        st["steps"].append(step_rec)
        ids = [r["id"] for r in step_rec["retrieved"] if r["id"] not in st["passages"]]
        st["passages"].update(traces.passages_of(info, _corpus_of(envs[slot]), ids))

    lm = getattr(agent, "lm", None)
    try:
        if getattr(lm, "concurrent_clients", False):

            def client(slot: int) -> Callable[[], None]:
                def play() -> None:
                    try:
                        while queue and not fatal:
                            start(slot)
                            while slot in active and not fatal:
                                st = active[slot]
                                try:
                                    (action,) = agent.act_batch([st["obs"]], [st["info"]], [slot])
                                except ConnectionError:
                                    raise
                                except Exception as exc:  # a failing agent or backend: this episode
                                    finish(slot, f"{type(exc).__name__}: {exc}")
                                    break
                                step(slot, action)
                    except BaseException as exc:  # stops every client; raised once they are done
                        fatal.append(exc)

                return play

            fatal: list[BaseException] = []
            lm.run_clients([client(slot) for slot in range(n_slots)])
            if fatal:
                raise fatal[0]
        else:
            while queue or active:
                for slot in range(n_slots):
                    if slot not in active and queue:
                        start(slot)
                slots = sorted(active)
                if not slots:  # every queued reset failed
                    continue
                try:
                    actions = agent.act_batch(
                        [active[s]["obs"] for s in slots], [active[s]["info"] for s in slots], slots
                    )
                except ConnectionError:
                    raise  # the backend cannot be reached: every episode would fail alike
                except Exception as exc:  # a failing agent or LLM backend must not end the run
                    for slot in slots:
                        finish(slot, f"{type(exc).__name__}: {exc}")
                    continue
                for slot, action in zip(slots, actions, strict=True):
                    step(slot, action)
    finally:
        for env in envs:
            env.close()
    return [records[i] for i in sorted(records)], time.perf_counter() - t0


#: a lone surrogate (``"\ud800"`` in JSON): Python text, but not Unicode that UTF-8 can hold
_SURROGATE = re.compile("[\ud800-\udfff]")


def _scrub(value: Any, where: str, found: list[str]) -> Any:
    """``value`` with every lone surrogate replaced by U+FFFD; the first place one was found
    is appended to ``found``."""
    if isinstance(value, str):
        if _SURROGATE.search(value):
            if not found:
                found.append(where or "(value)")
            return _SURROGATE.sub("\ufffd", value)
        return value
    if isinstance(value, dict):
        return {
            _scrub(k, where, found): _scrub(v, f"{where}.{k}" if where else str(k), found)
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [_scrub(v, f"{where}[{i}]", found) for i, v in enumerate(value)]
    return value


def _unicode_failure(rec: dict[str, Any]) -> dict[str, Any]:
    """An episode record whose text holds a lone surrogate (a question or passage that no
    loader checked) as a failed episode that can be written: the surrogates become U+FFFD and
    ``error`` names the field of the first one."""
    found: list[str] = []
    rec = _scrub(rec, "", found)
    where = found[0] if found else "(unknown)"
    error = (
        f"UnicodeEncodeError: the episode's {where} holds text that is not valid Unicode (a "
        "lone surrogate such as \\ud800, written as U+FFFD here): fix that record of the "
        "data file"
    )
    rec["error"] = f"{rec['error']}; {error}" if rec.get("error") else error
    return rec


def _corpus_of(env: gym.Env) -> Any:
    """The env's corpus (for passage texts), ``None`` when it has none (the reader env)."""
    return getattr(env.unwrapped, "corpus", None)


def _sub_em(episodes: list[dict[str, Any]]) -> float:
    """Mean sub-EM (Search-R1's ``subem_check``, FlashRAG's ``acc``) of the episodes' predictions:
    0.0 for an episode without one, and left out, as cover-EM is, where cover-EM is NaN."""
    vals = [
        metrics.sub_exact_match(e["prediction"], e["answers"]) if e.get("prediction") else 0.0
        for e in episodes
        if not (isinstance(e.get("cover_em"), float) and np.isnan(e["cover_em"]))
    ]
    return float(np.mean(vals)) if vals else float("nan")


def _em_interval(episodes: list[dict[str, Any]]) -> str | None:
    """The 95% percentile-bootstrap interval of the mean EM over questions, as ``low–high``."""
    vals = [
        e["em"]
        for e in episodes
        if e["em"] is not None and not (isinstance(e["em"], float) and np.isnan(e["em"]))
    ]
    if not vals:
        return None
    low, high = bootstrap_ci(vals)
    return f"{low:.2f}–{high:.2f}"


def summarise(agent: str, episodes: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
    """One leaderboard row from an agent's episodes."""

    def mean(key: str, subset=None) -> float:
        rows = episodes if subset is None else subset
        vals = [
            e[key]
            for e in rows
            if e[key] is not None and not (isinstance(e[key], float) and np.isnan(e[key]))
        ]
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
        "bad_replies": sum(e.get("bad_replies", 0) for e in episodes),
        "errors": sum(e["error"] is not None for e in episodes),
        "episodes": len(episodes),
    }


def evaluate(
    config: EvalConfig,
    agent_factory: Callable[[str, gym.Env], Agent],
    progress: Callable[[str, int, int], None] | None = None,
    lm_description: dict[str, Any] | None = None,
    command: str | None = None,
    judge: Callable[[str, str, list[str]], bool] | None = None,
    track: bool = False,
    resume: bool = False,
    overwrite: bool = False,
) -> EvalResult:
    """Run every agent on the sampled questions, write the run folder and return the rows.

    ``agent_factory(name, env)`` builds an agent; ``progress(agent, done, total)`` is called per
    finished episode; ``judge(question, prediction, golds)`` (an LLM judge) adds a ``judge``
    accuracy; ``track`` logs to Weights & Biases (offline unless configured online).

    Episodes are appended to ``episodes.jsonl`` as they end. ``resume`` goes on with the run in
    ``out_dir/run_name``: its protocol must be this one (agents may be added), and only the
    episodes it lacks are played. ``overwrite`` replaces an existing run folder (one holding
    ``protocol.json``; nothing else is ever deleted). Ctrl-C or SIGTERM (see
    :func:`sigterm_as_interrupt`) raise :class:`RunInterrupted` once the partial leaderboard is
    written.
    """
    run_dir = check_run_dir(config, resume=resume, overwrite=overwrite)
    base_env = make_env(config.env_id, {**config.env_kwargs, "split": config.split})
    examples = base_env.unwrapped.examples
    indices = sample_indices(len(examples), config.n, config.seed)
    question_ids = [examples[i].id for i in indices]
    if len(set(question_ids)) != len(question_ids):
        dup = next(q for q in question_ids if question_ids.count(q) > 1)
        raise ValueError(
            f"expected unique question ids, got {dup!r} more than once in {config.env_id} "
            f"{config.split}: fix the dataset file (a run could not tell its episodes apart)"
        )
    unwrapped = base_env.unwrapped

    agents = {name: agent_factory(name, base_env) for name in config.agents}
    described = {name: a.describe() for name, a in agents.items()}
    asked = [examples[i].question for i in indices]
    for name in config.agents:
        seen = _seen_questions(name, asked, config)
        if seen is not None:
            described[name]["seen_questions"] = seen
    protocol: dict[str, Any] = {
        "rag_gym_version": rag_gym.__version__,
        "env_id": config.env_id,
        "env_kwargs": config.env_kwargs,
        "split": config.split,
        "seed": config.seed,
        "n": len(indices),
        "question_ids": question_ids,
        "question_indices": indices,
        "retriever": type(unwrapped.retriever).__name__,
        "k": unwrapped.k,
        "corpus_mode": unwrapped.corpus_mode,
        # a server's size (None when it does not say), not the passages received so far
        "corpus_size": getattr(unwrapped.corpus, "server_size", len(unwrapped.corpus)),
        "answer_metric": unwrapped.answer_metric,
        "max_episode_steps": base_env.spec.max_episode_steps if base_env.spec else None,
        "agents": described,
        "lm": lm_description,
        "lm_spec": config.lm_spec,
        "judge": judge is not None,
        "batch_size": config.batch_size,
        "command": command,
        "config": {**asdict(config), "agents": list(config.agents)},
    }
    base_env.close()

    done: dict[tuple[str, str], dict[str, Any]] = {}  # (agent, question id) -> record
    timing: dict[str, float] = {}  # agent -> wall seconds over every session of the run
    if resume:
        assert run_dir is not None
        saved = read_protocol(run_dir)
        check_resumable(saved, protocol, run_dir)
        protocol["command"] = saved.get("command")
        protocol["resumed_by"] = [*saved.get("resumed_by", []), command]
        wanted = set(question_ids)
        for rec in load_episodes(run_dir / "episodes.jsonl"):
            key = (rec["agent"], rec["question_id"])
            if rec["agent"] not in agents or rec["question_id"] not in wanted or key in done:
                raise ValueError(
                    f"{run_dir / 'episodes.jsonl'}: expected one episode per agent and question "
                    f"of the run's protocol, got {'another' if key in done else 'an'} episode of "
                    f"{key}: the file is damaged; start over with --overwrite"
                )
            done[key] = rec
        again = [key for key, rec in done.items() if replayable(rec)]
        if again:  # failed for a reason outside the agent: played again, so out of the file
            for key in again:
                del done[key]
            _atomic_write(
                run_dir / "episodes.jsonl",
                "".join(
                    json.dumps(r, ensure_ascii=False, default=str) + "\n" for r in done.values()
                ),
            )
        timing = _read_timing(run_dir)
        _atomic_write(run_dir / "protocol.json", _protocol_text(protocol))
    else:
        run_dir = _claim_run_dir(config, run_dir, protocol, overwrite)

    path = run_dir / "episodes.jsonl"
    qids_of: dict[str, list[str]] = {}
    rows = []
    new_episodes = 0
    current: dict[str, Any] = {}  # the agent playing: its name, start, prior seconds
    f = open(path, "a", encoding="utf-8")  # noqa: SIM115 (closed below, also on interrupts)
    tracer = traces.TraceWriter(run_dir)
    try:
        for name, agent in agents.items():
            kind = agent_class(name).env_kind
            env_id = env_id_for(config.env_id, kind)
            kwargs = dict(config.env_kwargs)
            if kind not in ("search", "text"):
                kwargs.pop("k", None)
                kwargs.pop("exclude_seen", None)
            if kind == "tree":
                kwargs["prune"] = "none"
            kwargs["split"] = config.split
            # kept until the agent has played: its questions and index stay in the shared data
            # cache, so run_agent's copies reuse them instead of loading and indexing again
            probe = make_env(env_id, kwargs, agent)
            try:
                available = {ex.id for ex in probe.unwrapped.examples}  # the reader skips some
                qids = qids_of[name] = [q for q in question_ids if q in available]
                todo = [(i, q) for i, q in enumerate(qids) if (name, q) not in done]
                prior = len(qids) - len(todo)
                tick = None
                if progress is not None:
                    total = len(qids)
                    progress(name, prior, total)

                    def tick(n_done: int, name=name, prior=prior, total=total) -> None:
                        progress(name, prior + n_done, total)

                current.update(name=name, t0=time.perf_counter(), prior=timing.get(name, 0.0))
                last_save = [time.perf_counter()]

                def on_episode(rec: dict[str, Any], name=name, env_id=env_id, last=last_save):
                    nonlocal new_episodes
                    rec["agent"] = name
                    rec["env_id"] = env_id
                    trace = rec.pop("trace", None)
                    if judge is not None and rec["prediction"] and rec["answerable"]:
                        rec["judge"] = float(
                            judge(rec["question"], rec["prediction"], rec["answers"])
                        )
                    line = json.dumps(rec, ensure_ascii=False, default=str)
                    if _SURROGATE.search(line):  # no file can hold it: the episode fails, named
                        rec = _unicode_failure(rec)
                        line = json.dumps(rec, ensure_ascii=False, default=str)
                    if trace is not None and _SURROGATE.search(
                        json.dumps(trace, ensure_ascii=False, default=str)
                    ):  # a raw reply the env sanitised: its trace keeps the rest of it
                        trace = _scrub(trace, "", [])
                    if trace is not None:  # before the episode: a resume replays a lost one
                        tracer.write(name, rec["question_id"], trace["steps"], trace["passages"])
                    f.write(line + "\n")
                    f.flush()
                    new_episodes += 1
                    done[(name, rec["question_id"])] = json.loads(line)  # as a resume reads it
                    if time.perf_counter() - last[0] > 2.0:
                        _save_timing(run_dir, timing, current)
                        last[0] = time.perf_counter()

                if todo:
                    run_agent(
                        env_id,
                        kwargs,
                        agent,
                        [q for _, q in todo],
                        config.seed,
                        config.batch_size,
                        tick,
                        orders=[i for i, _ in todo],
                        on_episode=on_episode,
                        trace=True,
                    )
                    _save_timing(run_dir, timing, current)
                current.clear()
            finally:
                probe.close()
            rows.append(summarise(name, [done[(name, q)] for q in qids], timing.get(name, 0.0)))
    except BaseException as exc:
        f.close()
        tracer.close()
        if current:
            _save_timing(run_dir, timing, current)
        _write_partial(run_dir, config.agents, timing)
        if isinstance(exc, KeyboardInterrupt):
            reason = exc.args[0] if exc.args and isinstance(exc.args[0], str) else "SIGINT"
            raise RunInterrupted(run_dir, len(done), new_episodes, reason) from exc
        exc.add_note(
            f"rag-gym: {len(done)} finished episodes are saved in {run_dir} (partial leaderboard "
            "there); once the cause is fixed, resume with evaluate(..., resume=True) "
            f"(rag-gym evaluate --resume {run_dir})"
        )
        raise
    f.close()
    tracer.close()
    episodes = [done[(name, q)] for name in agents for q in qids_of[name]]
    result = EvalResult(config, run_dir, rows, episodes, protocol)
    try:
        write_run(result)  # each file replaced atomically: old or new, never half written
        if track:
            log_to_wandb(result)
    except KeyboardInterrupt as exc:  # every episode is saved: the leaderboard is the full one
        _write_partial(run_dir, config.agents, timing)
        reason = exc.args[0] if exc.args and isinstance(exc.args[0], str) else "SIGINT"
        raise RunInterrupted(run_dir, len(done), new_episodes, reason) from exc
    return result


def _seen_questions(name: str, questions: list[str], config: EvalConfig) -> dict[str, Any] | None:
    """For an agent with a checkpoint (``search_r1:PATH``): how many of the evaluated questions
    are in the split it was trained on (:func:`rag_gym.agents.provenance.seen_questions`),
    warned about when not 0, so that a figure that is not held out does not pass for one."""
    from rag_gym.baselines import split_agent_name

    checkpoint = split_agent_name(name)[1]
    if checkpoint is None:
        return None
    from rag_gym.agents.provenance import SeenQuestionsWarning, seen_questions
    from rag_gym.agents.search_r1 import checkpoint_path

    try:
        report = seen_questions(checkpoint_path(checkpoint), questions)
    except Exception as exc:  # a report, never a reason to stop an evaluation
        error = f"{type(exc).__name__}: {exc}"
        warnings.warn(
            f"{name}: could not check which evaluated questions it was trained on: {error}",
            SeenQuestionsWarning,
            stacklevel=3,
        )
        return {"seen": None, "n": len(questions), "training_sets": [], "error": error}
    if report["seen"]:
        where = "; ".join(
            f"{ts['env_id']} {ts['env_kwargs'] or ''} {ts['split']}".replace("  ", " ")
            for ts in report["training_sets"]
            if ts.get("seen")
        )
        warnings.warn(
            f"{name}: {report['seen']} of the {report['n']} evaluated questions of "
            f"{config.env_id} {config.split} are in the split it was trained on ({where}): its "
            "figures here are not held out. Evaluate on questions training never saw (another "
            "split of its training world), or note it beside the figures",
            SeenQuestionsWarning,
            stacklevel=3,
        )
    return report


def evaluate_checkpoint(
    checkpoint: str | Path,
    env_id: str,
    n: int,
    out_dir: str | Path,
    run_name: str,
    split: str = "test",
    seed: int = 0,
    env_kwargs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``rag-gym evaluate --split SPLIT --n N --agents search_r1:CHECKPOINT``: the checkpoint
    folder of a training run played greedily through llama.cpp (the main command's backend, its
    GGUF adapter over the embedded model) on ``n`` questions of ``split`` of the env made with
    ``env_kwargs`` (the training world's, for a held-out figure). Writes the run folder
    ``out_dir/run_name`` and returns the agent's leaderboard row."""
    from rag_gym.baselines import make_agent
    from rag_gym.generation.backends import make_lm

    lm = make_lm("llama_cpp", seed=seed)
    config = EvalConfig(
        env_id=env_id,
        env_kwargs=dict(env_kwargs or {}),
        split=split,
        n=n,
        seed=seed,
        agents=(f"search_r1:{checkpoint}",),
        lm_spec="llama_cpp",
        out_dir=str(out_dir),
        run_name=run_name,
    )
    result = evaluate(config, lambda name, env: make_agent(name, lm=lm, seed=seed, env=env))
    return result.rows[0]


def _protocol_text(protocol: dict[str, Any]) -> str:
    return json.dumps(protocol, indent=2, default=str) + "\n"


def _claim_run_dir(
    config: EvalConfig, run_dir: Path | None, protocol: dict[str, Any], overwrite: bool
) -> Path:
    """Create the run folder of a new run and write its protocol; the folder is this run's alone
    (a unique default name, or ``protocol.json`` created exclusively)."""
    if run_dir is None:
        out = check_out_dir(config.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        for _ in range(100):
            run_dir = out / default_run_name(config)
            try:
                run_dir.mkdir()
                break
            except FileExistsError:
                continue
        else:  # pragma: no cover (100 collisions of a random suffix)
            raise FileExistsError(f"could not create a new run folder in {out}")
    else:
        run_dir = check_run_dir(config, overwrite=overwrite)  # again: another run may have begun
        assert run_dir is not None
        if overwrite and is_run_folder(run_dir):
            shutil.rmtree(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
    try:
        with open(run_dir / "protocol.json", "x", encoding="utf-8"):
            pass
    except FileExistsError:
        raise FileExistsError(
            f"{run_dir} already holds a run (another run started there meanwhile): "
            "pick another --run-name"
        ) from None
    _atomic_write(run_dir / "protocol.json", _protocol_text(protocol))
    return run_dir


def _read_timing(run_dir: Path) -> dict[str, float]:
    try:
        saved = json.loads((run_dir / "timing.json").read_text())
        return {str(k): float(v) for k, v in saved.items()}
    except (OSError, ValueError, TypeError, AttributeError):
        return {}  # only the s/ep column depends on it


def _save_timing(run_dir: Path, timing: dict[str, float], current: dict[str, Any]) -> None:
    """Add the playing agent's time so far to ``timing`` and save it (``timing.json``)."""
    if current:
        timing[current["name"]] = current["prior"] + time.perf_counter() - current["t0"]
    _atomic_write(run_dir / "timing.json", json.dumps(timing) + "\n")


def _write_partial(run_dir: Path, agents: tuple[str, ...], timing: dict[str, float]) -> None:
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
    _atomic_write(run_dir / "leaderboard.csv", buf.getvalue())
    _atomic_write(run_dir / "leaderboard.md", leaderboard_markdown(rows) + "\n")


def write_run(result: EvalResult) -> None:
    """The whole run folder: protocol, episodes and their step traces in protocol order,
    leaderboard and plots."""
    d = result.run_dir
    _atomic_write(d / "protocol.json", _protocol_text(result.protocol))
    _atomic_write(
        d / "episodes.jsonl",
        "".join(json.dumps(e, ensure_ascii=False, default=str) + "\n" for e in result.episodes),
    )
    _order_traces(d, result.episodes)
    write_leaderboard(d, result.rows)
    write_plots(result.rows, d)


def _order_traces(run_dir: Path, episodes: list[dict[str, Any]]) -> None:
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
    _atomic_write(path, "".join(latest[k] + "\n" for k in keys if k in latest))


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
    for row in sorted(
        rows, key=lambda r: (-np.nan_to_num(r["em"], nan=-1), -np.nan_to_num(r["f1"], nan=-1))
    ):
        lines.append("| " + " | ".join(format_cell(k, row[k]) for k, _, _ in COLUMNS) + " |")
    return "\n".join(lines)

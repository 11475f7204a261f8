"""The evaluation itself: every agent on the pinned questions, each episode saved as it ends,
a stopped run resumed (:func:`evaluate`); a training checkpoint's test figure
(:func:`evaluate_checkpoint`)."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import gymnasium as gym

import rag_gym
from rag_gym import traces
from rag_gym._text import shown
from rag_gym.agents.base import Agent
from rag_gym.baselines import agent_class
from rag_gym.evaluate.config import EvalConfig, EvalResult, check_run_dir, claim_run_dir
from rag_gym.evaluate.leaderboard import log_to_wandb, summarise, write_partial, write_run
from rag_gym.evaluate.run_folder import (
    atomic_write,
    check_resumable,
    load_episodes,
    protocol_text,
    read_protocol,
    read_timing,
    save_timing,
)
from rag_gym.evaluate.scheduler import (
    env_id_for,
    make_env,
    outside_error,
    replayable,
    run_agent,
    sample_indices,
)

#: episodes in a row that fail for their backend (or their judge's) before a run stops, at
#: least; a batch fails together, so the bound is ``max(STOP_AFTER_FAILURES, 2 * batch_size)``
STOP_AFTER_FAILURES = 8


class MissingResultsWarning(UserWarning):
    """At the end of a run: episodes that failed for their backend, or whose judge gave no
    verdict, counted with their reasons. Their figures are missing from the leaderboard until a
    resume plays them again."""


class JudgeWarning(UserWarning):
    """The first episode of a run on which the judge gave no verdict (its judge value is
    recorded as missing)."""


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
    episodes: Callable[..., None] | None = None,
) -> EvalResult:
    """Run every agent on the sampled questions, write the run folder and return the rows.

    ``agent_factory(name, env)`` builds an agent; ``progress(agent, done, total, em)`` is called
    as an agent starts and per finished episode, with ``em`` the mean EM of its finished
    episodes (``None`` before the first); ``judge(question, prediction, golds)`` (an LLM judge:
    its ``verdict`` method when it has one) adds a ``judge`` accuracy, over the episodes it gave
    a verdict on: a judge that gives none leaves the episode's ``judge`` missing, with the reason
    in ``judge_error`` (:func:`_judge_episode`); ``track`` logs to Weights & Biases (offline
    unless configured online).

    Agents are played in :func:`play_order` (the trained ones first); the episodes file, the
    rows and the protocol follow ``config.agents``.

    Episodes that fail for their LLM backend (a ``BackendError``, a ``TimeoutError``) are
    recorded failed; ``max(STOP_AFTER_FAILURES, 2 * batch_size)`` such failures in a row stop
    the run with a ``ConnectionError``, as an unreachable backend or judge does at once. At the
    end, a :class:`MissingResultsWarning` counts the episodes a resume would play again
    (:func:`missing_results`).

    Episodes are appended to ``episodes.jsonl`` as they end. ``resume`` goes on with the run in
    ``out_dir/run_name``: its protocol must be this one (agents may be added), and only the
    episodes it lacks are played. ``overwrite`` replaces an existing run folder (one holding
    ``protocol.json``; nothing else is ever deleted). Ctrl-C or SIGTERM (see
    :func:`sigterm_as_interrupt`) raise :class:`RunInterrupted` once the partial leaderboard is
    written.

    ``episodes`` plays an agent's missing episodes elsewhere, called as ``episodes(name, env_id,
    env_kwargs, (run env id, run env kwargs), question_ids, orders, seed, batch_size,
    on_episode, tick)`` (:class:`~rag_gym.evaluate.distributed.RayEpisodes` on a Ray cluster);
    by default they are played here (:func:`~rag_gym.evaluate.scheduler.run_agent`).
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
        "judge": config.judge if config.judge is not None else judge is not None,
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
            atomic_write(
                run_dir / "episodes.jsonl",
                "".join(
                    json.dumps(r, ensure_ascii=False, default=str) + "\n" for r in done.values()
                ),
            )
        timing = read_timing(run_dir)
        atomic_write(run_dir / "protocol.json", protocol_text(protocol))
    else:
        run_dir = claim_run_dir(config, run_dir, protocol, overwrite)

    path = run_dir / "episodes.jsonl"
    qids_of: dict[str, list[str]] = {}
    rows: dict[str, dict[str, Any]] = {}  # agent -> its leaderboard row
    new_episodes = 0
    current: dict[str, Any] = {}  # the agent playing: its name, start, prior seconds
    f = open(path, "a", encoding="utf-8")  # noqa: SIM115 (closed below, also on interrupts)
    tracer = traces.TraceWriter(run_dir)
    try:
        for name in play_order(config.agents):
            agent = agents[name]
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
                # the running EM: the sum and count of the finished episodes' EM values
                em_sum = [0.0, 0]
                for q in qids:
                    if (name, q) in done:
                        _add_em(em_sum, done[(name, q)])
                tick = None
                if progress is not None:
                    total = len(qids)
                    progress(name, prior, total, _mean_em(em_sum))

                    def tick(n_done: int, name=name, prior=prior, total=total, em=em_sum) -> None:
                        progress(name, prior + n_done, total, _mean_em(em))

                current.update(name=name, t0=time.perf_counter(), prior=timing.get(name, 0.0))
                failures: dict[str, Any] = {"row": 0, "last": None, "judge_warned": False}
                last_save = [time.perf_counter()]

                def on_episode(
                    rec: dict[str, Any],
                    name=name,
                    env_id=env_id,
                    last=last_save,
                    failures=failures,
                    em=em_sum,
                ):
                    nonlocal new_episodes
                    rec["agent"] = name
                    rec["env_id"] = env_id
                    trace = rec.pop("trace", None)
                    if judge is not None:
                        _judge_episode(judge, rec, failures)
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
                    _add_em(em, rec)
                    if time.perf_counter() - last[0] > 2.0:
                        save_timing(run_dir, timing, current)
                        last[0] = time.perf_counter()
                    _check_backend(
                        name, rec, failures, max(STOP_AFTER_FAILURES, 2 * config.batch_size)
                    )

                if todo and episodes is not None:
                    episodes(
                        name,
                        env_id,
                        kwargs,
                        (config.env_id, {**config.env_kwargs, "split": config.split}),
                        [q for _, q in todo],
                        [i for i, _ in todo],
                        config.seed,
                        config.batch_size,
                        on_episode,
                        tick,
                    )
                    save_timing(run_dir, timing, current)
                elif todo:
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
                    save_timing(run_dir, timing, current)
                current.clear()
            finally:
                probe.close()
            rows[name] = summarise(name, [done[(name, q)] for q in qids], timing.get(name, 0.0))
    except BaseException as exc:
        f.close()
        tracer.close()
        if current:
            save_timing(run_dir, timing, current)
        write_partial(run_dir, config.agents, timing)
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
    result = EvalResult(config, run_dir, [rows[name] for name in agents], episodes, protocol)
    missing = missing_results(episodes)
    if missing:
        warnings.warn(f"{run_dir}: {missing}", MissingResultsWarning, stacklevel=2)
    try:
        write_run(result)  # each file replaced atomically: old or new, never half written
        if track:
            log_to_wandb(result)
    except KeyboardInterrupt as exc:  # every episode is saved: the leaderboard is the full one
        write_partial(run_dir, config.agents, timing)
        reason = exc.args[0] if exc.args and isinstance(exc.args[0], str) else "SIGINT"
        raise RunInterrupted(run_dir, len(done), new_episodes, reason) from exc
    return result


def play_order(agents: tuple[str, ...] | list[str]) -> list[str]:
    """The order :func:`evaluate` plays a run's agents in: those with a checkpoint
    (``search_r1:RUN``, the trained agents a run is usually about) first, then the others, each
    group in the run's order, so that the agent of interest shows its progress first.

    Only the playing order: an episode's seed depends on its question's place in the protocol,
    never on the agent's, and the episodes file, the leaderboard and a resume follow the run's
    own order of agents.

    >>> play_order(("naive_rag", "random", "search_r1:synthhop"))
    ['search_r1:synthhop', 'naive_rag', 'random']
    """
    from rag_gym.baselines import split_agent_name

    trained = [a for a in agents if split_agent_name(a)[1] is not None]
    return [*trained, *(a for a in agents if a not in trained)]


def _add_em(em_sum: list, rec: dict[str, Any]) -> None:
    """Add an episode's EM (when it has one) to a running ``[sum, count]``."""
    value = rec.get("em")
    if isinstance(value, (int, float)) and value == value:  # not None, not NaN
        em_sum[0] += float(value)
        em_sum[1] += 1


def _mean_em(em_sum: list) -> float | None:
    return em_sum[0] / em_sum[1] if em_sum[1] else None


def _judge_episode(judge: Callable[..., Any], rec: dict[str, Any], failures: dict) -> None:
    """Ask ``judge`` (its ``verdict`` method when it has one, which raises where a call gives
    no verdict) about an answered, answerable episode. ``rec["judge"]`` is 1.0 or 0.0; a judge
    that gives no verdict leaves it ``None`` and sets ``rec["judge_error"]`` to the reason (a
    warning the first time), so the judge column is taken over the judged episodes only and a
    resume asks again. A judge that cannot be reached raises ``ConnectionError``: the run
    stops, as it does for an unreachable LLM backend, and the episode is not recorded."""
    rec["judge_error"] = None
    if not (rec["prediction"] and rec["answerable"]):
        return
    ask = getattr(judge, "verdict", judge)
    try:
        value = ask(rec["question"], rec["prediction"], rec["answers"])
    except ConnectionError as exc:
        raise ConnectionError(f"the judge cannot be reached: {shown(exc)}") from exc
    except Exception as exc:  # no verdict: recorded as missing, never as "no"
        rec["judge_error"] = f"{type(exc).__name__}: {shown(exc)}"
    else:
        if isinstance(value, bool) or (isinstance(value, (int, float)) and value in (0, 1)):
            rec["judge"] = float(value)
        else:
            rec["judge_error"] = (
                f"TypeError: expected the judge to return True or False, got "
                f"{shown(repr(value), 80)}"
            )
    if rec["judge_error"] is not None and not failures["judge_warned"]:
        failures["judge_warned"] = True
        warnings.warn(
            f"the judge gave no verdict on {rec['agent']}'s episode {rec['question_id']!r} "
            f"({rec['judge_error']}): its judge value is recorded as missing, and --resume "
            "asks again (further ones are counted at the end of the run)",
            JudgeWarning,
            stacklevel=4,
        )


def _check_backend(name: str, rec: dict[str, Any], failures: dict, limit: int) -> None:
    """Count the episodes in a row that failed for their backend or their judge's (an error
    of :func:`~rag_gym.evaluate.scheduler.outside_error`'s kind); at ``limit``, stop the run
    with a ``ConnectionError`` naming the last failure: the failed episodes are saved and a
    resume plays them again."""
    error = rec.get("error")
    judge_error = rec.get("judge_error")
    if outside_error(error):
        failures["row"] += 1
        failures["last"] = error
    elif outside_error(judge_error):
        failures["row"] += 1
        failures["last"] = f"the judge's {judge_error}"
    else:
        failures["row"] = 0
    if failures["row"] >= limit:
        raise ConnectionError(
            f"stopped: the last {failures['row']} episodes of {name} failed for their backend "
            f"(the last: {shown(failures['last'])}); they are saved as failed, and a resume "
            "plays them again once the backend works"
        )


def missing_results(episodes: list[dict[str, Any]]) -> str | None:
    """What a run lacks for a reason outside its agents, as one sentence (``None`` when
    nothing): episodes failed for their backend and judge verdicts missing, counted, with the
    first reason of each kind. A resume plays those episodes again."""
    failed = [e for e in episodes if outside_error(e.get("error"))]
    unjudged = [e for e in episodes if e.get("judge_error") is not None]
    if not failed and not unjudged:
        return None
    parts = []
    if failed:
        parts.append(
            f"{len(failed)} episodes failed for their backend (the first: "
            f"{shown(failed[0]['error'], 200)})"
        )
    if unjudged:
        asked = sum(1 for e in episodes if e.get("judge") is not None) + len(unjudged)
        reasons: dict[str, int] = {}
        for e in unjudged:
            kind = e["judge_error"].split(":", 1)[0]
            reasons[kind] = reasons.get(kind, 0) + 1
        why = ", ".join(f"{n} {kind}" for kind, n in reasons.items())
        parts.append(
            f"the judge gave no verdict on {len(unjudged)} of {asked} judged episodes ({why}; "
            f"the first: {shown(unjudged[0]['judge_error'], 200)}): the judge column is over "
            "the others"
        )
    return "; ".join(parts) + "; resume the run to play them again"


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
    GGUF adapter over the base GGUF it was trained on) on ``n`` questions of ``split`` of the env made with
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

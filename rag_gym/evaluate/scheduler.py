"""Playing an agent's episodes: the envs the evaluator builds, the pinned question sample,
and :class:`EpisodeScheduler`, which keeps ``batch_size`` episodes running and records each as
it ends."""

from __future__ import annotations

import builtins
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import gymnasium as gym
import numpy as np

from rag_gym import health, make, metrics, traces
from rag_gym.agents.base import Agent

#: the env id suffix of each agent kind ("text" agents play the search env through TextActions)
_SUFFIX = {"search": "", "text": "", "tree": "-Tree", "reader": "-Reader"}


#: errors of the machine, not of the agent or the question: an episode recorded with one is
#: played again by a resumed run. ``BackendError`` is an LLM backend's failure of any other
#: kind (an HTTP error status, a reply that is not the API's JSON:
#: :class:`rag_gym.generation.lm.BackendError`); errors are recorded as text, so by name
_OUTSIDE_ERRORS = frozenset(
    name
    for name, value in vars(builtins).items()
    if isinstance(value, type) and issubclass(value, (OSError, MemoryError))
) | {"BackendError"}


def outside_error(error: object) -> bool:
    """Whether a recorded ``error`` text (``"Type: message"``) is a failure outside the agent
    and the question (see :data:`_OUTSIDE_ERRORS`)."""
    return isinstance(error, str) and error.split(":", 1)[0].strip() in _OUTSIDE_ERRORS


def replayable(record: dict[str, Any]) -> bool:
    """Whether an episode record failed for a reason outside the agent and the question, so
    that a resumed run plays it again: an ``OSError`` (a backend's ``TimeoutError`` or
    ``ConnectionError``), a ``MemoryError``, an LLM backend's ``BackendError``, or a judge that
    gave no verdict (``judge_error``)."""
    return outside_error(record.get("error")) or record.get("judge_error") is not None


def make_env(env_id: str, kwargs: dict[str, Any], agent: Agent | None = None) -> gym.Env:
    """Every env the evaluator builds, ``agent``'s own included: :func:`rag_gym.make` of
    ``kwargs`` (``reward_preset`` / ``reward_kwargs`` among them); a ``"text"`` agent
    (``search_r1``) plays through :class:`~rag_gym.wrappers.TextActions` with its own tags."""
    text = agent is not None and agent.env_kind == "text"
    return make(env_id, **kwargs, text_actions=agent.tags if text else None)


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


def episode_record(
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


def failed_record(kind: str, qid: str, example: Any, error: str) -> dict[str, Any]:
    """The record of an episode that failed before it started (``reset`` raised)."""

    try:
        list(example.answers), bool(example.answerable)
    except Exception:  # a record broken in any way: no answers known
        example = SimpleNamespace(answers=[], answerable=True)
    question = getattr(example, "question", None)
    rec = episode_record(
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


def _corpus_of(env: gym.Env) -> Any:
    """The env's corpus (for passage texts), ``None`` when it has none (the reader env)."""
    return getattr(env.unwrapped, "corpus", None)


class EpisodeScheduler:
    """Plays one agent's episodes in ``batch_size`` env slots, and records each as it ends.

    A slot holds one running episode (:class:`_Running`); :meth:`run` fills the free slots from
    the queue of questions, asks the agent for the running episodes' actions, steps their envs
    and records every episode that ends (``on_episode(record)``, then ``progress(done)``).
    See :func:`run_agent` for what is recorded and which errors end an episode or the run."""

    def __init__(
        self,
        env_id: str,
        env_kwargs: dict[str, Any],
        agent: Agent,
        seed: int,
        batch_size: int,
        progress: Callable[[int], None] | None = None,
        on_episode: Callable[[dict[str, Any]], None] | None = None,
        trace: bool = False,
    ) -> None:
        self.env_id, self.env_kwargs, self.agent = env_id, env_kwargs, agent
        self.kind = agent.env_kind
        self.seed, self.batch_size, self.trace = seed, batch_size, trace
        self.progress, self.on_episode = progress, on_episode
        self.envs: list[gym.Env] = []
        self.queue: list[tuple[int, str]] = []
        self.records: dict[int, dict[str, Any]] = {}
        self.active: dict[int, _Running] = {}
        self.by_id: dict[str, Any] = {}

    def run(
        self, question_ids: list[str], orders: list[int] | None = None
    ) -> tuple[list[dict[str, Any]], float]:
        """Play every question (question ``question_ids[i]`` is episode ``orders[i]`` of the
        protocol, default ``i``, which fixes its seed); the records in question order and the
        wall time."""
        if orders is None:
            orders = list(range(len(question_ids)))
        if len(orders) != len(question_ids):
            raise ValueError(
                f"expected one order per question, got {len(orders)} for {len(question_ids)}"
            )
        n_slots = max(1, min(self.batch_size, len(question_ids)))
        self.envs = [self._make_env() for _ in range(n_slots)]
        self.by_id = {ex.id: ex for ex in self.envs[0].unwrapped.examples}
        self.queue = list(zip(orders, question_ids, strict=True))
        self.records, self.active = {}, {}
        t0 = time.perf_counter()
        try:
            if getattr(getattr(self.agent, "lm", None), "concurrent_clients", False):
                self._play_concurrently(n_slots)
            else:
                self._play_in_lockstep(n_slots)
        finally:
            for env in self.envs:
                env.close()
        return [self.records[i] for i in sorted(self.records)], time.perf_counter() - t0

    def _make_env(self) -> gym.Env:
        return make_env(self.env_id, self.env_kwargs, self.agent)

    def _play_in_lockstep(self, n_slots: int) -> None:
        """Every agent step is one batched call for all running episodes."""
        agent = self.agent
        while self.queue or self.active:
            for slot in range(n_slots):
                if slot not in self.active and self.queue:
                    self.start(slot)
            slots = sorted(self.active)
            if not slots:  # every queued reset failed
                continue
            try:
                actions = agent.act_batch(
                    [self.active[s].obs for s in slots], [self.active[s].info for s in slots], slots
                )
            except ConnectionError:
                raise  # the backend cannot be reached: every episode would fail alike
            except Exception as exc:  # a failing agent or LLM backend must not end the run
                for slot in slots:
                    self.finish(slot, f"{type(exc).__name__}: {exc}")
                continue
            for slot, action in zip(slots, actions, strict=True):
                self.step(slot, action)

    def _play_concurrently(self, n_slots: int) -> None:
        """Each slot plays on its own; the model batches the slots' requests
        (``lm.run_clients``)."""
        fatal: list[BaseException] = []

        def client(slot: int) -> Callable[[], None]:
            def play() -> None:
                try:
                    while self.queue and not fatal:
                        self.start(slot)
                        while slot in self.active and not fatal:
                            running = self.active[slot]
                            try:
                                (action,) = self.agent.act_batch(
                                    [running.obs], [running.info], [slot]
                                )
                            except ConnectionError:
                                raise
                            except Exception as exc:  # a failing agent or backend: this episode
                                self.finish(slot, f"{type(exc).__name__}: {exc}")
                                break
                            self.step(slot, action)
                except BaseException as exc:  # stops every client; raised once they are done
                    fatal.append(exc)

            return play

        self.agent.lm.run_clients([client(slot) for slot in range(n_slots)])
        if fatal:
            raise fatal[0]

    def _record(self, order: int, rec: dict[str, Any]) -> None:
        self.records[order] = rec
        if self.on_episode is not None:
            self.on_episode(rec)
        if self.progress is not None:
            self.progress(len(self.records))

    def start(self, slot: int) -> None:
        """Start the next queued episode in ``slot``; one whose reset fails is recorded."""
        while self.queue:
            order, qid = self.queue.pop(0)
            episode_seed = self.seed * 1_000_003 + order
            t_start = time.perf_counter()
            try:
                obs, info = self.envs[slot].reset(seed=episode_seed, options={"question_id": qid})
            except OSError:
                raise
            except Exception as exc:  # a bad record must not end the run
                # an env whose reset raised is in no known state (Gymnasium's env checker
                # keeps a half-done first reset): this slot gets a new one
                self.envs[slot].close()
                self.envs[slot] = self._make_env()
                rec = failed_record(
                    self.kind, qid, self.by_id.get(qid), f"{type(exc).__name__}: {exc}"
                )
                rec["seconds"] = time.perf_counter() - t_start
                self._record(order, rec)
                continue
            self.agent.reset(episode_seed, slot)
            self.active[slot] = _Running(order=order, obs=obs, info=info, t0=t_start)
            return

    def finish(self, slot: int, error: str | None = None) -> None:
        """Record ``slot``'s episode (failed with ``error``, if given) and free the slot."""
        running = self.active.pop(slot)
        env = self.envs[slot]
        rec = episode_record(
            self.kind,
            running.start_info,
            running.info,
            running.actions,
            running.reward,
            running.terminated,
            running.truncated,
            env.unwrapped.current_example,
            error,
        )
        usage = self.agent.usage_of(slot)
        rec["prompt_tokens"] = usage["prompt_tokens"]
        rec["completion_tokens"] = usage["completion_tokens"]
        rec["bad_replies"] = usage.get("bad_replies", 0)
        rec["seconds"] = time.perf_counter() - running.t0
        if self.trace:
            missing = [g for g in rec["gold_ids"] if g not in running.passages]
            running.passages.update(traces.passages_of({}, _corpus_of(env), missing))
            rec["trace"] = {"steps": running.steps, "passages": running.passages}
            if error is None:
                budget = getattr(getattr(self.agent, "config", None), "max_tokens", None)
                rec["health"] = health.episode_flags(
                    running.steps,
                    rec["actions"][-1] if rec["actions"] else None,
                    rec["truncated"] and not rec["terminated"],
                    rec["gold_ids"],
                    budget if isinstance(budget, int) else None,
                )
        self._record(running.order, rec)

    def step(self, slot: int, action: Any) -> None:
        """Step ``slot``'s env with ``action``; an episode that ends is recorded."""
        running = self.active[slot]
        raw = self.agent.take_raw_output(slot)
        try:
            obs, reward, terminated, truncated, info = self.envs[slot].step(action)
        except OSError:
            raise
        except Exception as exc:  # an action outside the env's space, or an env fault
            message = f"{type(exc).__name__}: {exc}"
            if self.trace:
                self._trace_step(slot, running, action, {"message": message}, 0.0, raw)
            self.finish(slot, message)
            return
        if self.trace:
            self._trace_step(slot, running, action, info, reward, raw)
        running.obs, running.info = obs, info
        running.terminated, running.truncated = terminated, truncated
        running.reward += float(reward)
        running.actions.append(info.get("action_type") or self.kind.upper())
        if terminated or truncated:
            self.finish(slot)

    def _trace_step(
        self, slot: int, running: _Running, action: Any, info: dict, reward: float, raw: Any
    ) -> None:
        usage = self.agent.usage_of(slot)
        pt, ct = usage["prompt_tokens"], usage["completion_tokens"]
        step_rec = traces.step_record(
            len(running.steps) + 1,
            action,
            info,
            reward,
            running.start_info.get("gold_ids", []),
            raw,
            pt - running.tokens[0],
            ct - running.tokens[1],
        )
        running.tokens = (pt, ct)
        running.steps.append(step_rec)
        ids = [r["id"] for r in step_rec["retrieved"] if r["id"] not in running.passages]
        running.passages.update(traces.passages_of(info, _corpus_of(self.envs[slot]), ids))


@dataclass
class _Running:
    """An episode in a slot: where it stands, and its trace so far."""

    order: int
    obs: Any
    info: dict
    t0: float
    start_info: dict = field(init=False)
    actions: list[str] = field(default_factory=list)
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    steps: list[dict[str, Any]] = field(default_factory=list)
    passages: dict[str, Any] = field(default_factory=dict)
    tokens: tuple[int, int] = (0, 0)

    def __post_init__(self) -> None:
        self.start_info = self.info


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
    exception ends the episodes of that call as failed episodes (``error`` set; a backend's
    ``BackendError`` or ``TimeoutError`` is :func:`replayable`), and so does an env exception in
    ``reset`` or ``step`` (a bad record, an action outside the space); the run goes on. An ``OSError`` from the env (retrieval server unreachable) and a
    ``ConnectionError`` from the agent (its LLM server cannot be reached) are raised: every
    episode would fail alike, and the run is to be resumed once the cause is fixed.
    """
    scheduler = EpisodeScheduler(
        env_id, env_kwargs, agent, seed, batch_size, progress, on_episode, trace
    )
    return scheduler.run(question_ids, orders)

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
command), ``episodes.jsonl``, ``leaderboard.csv``, ``leaderboard.md`` and two plots
(``em_f1.png``: EM and F1 per agent; ``accuracy_vs_retrievals.png``: EM against the mean number
of searches, as LWTS Figure 1).
"""

from __future__ import annotations

import csv
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

import rag_gym
from rag_gym import metrics
from rag_gym.agents.base import Agent
from rag_gym.baselines import agent_class, check_agent_name

#: leaderboard columns: (key, header, format)
COLUMNS = (
    ("agent", "agent", "{}"),
    ("em", "EM", "{:.3f}"),
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
_SUFFIX = {"search": "", "tree": "-Tree", "reader": "-Reader"}


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
    agents: tuple[str, ...] = ("naive_rag", "random")
    """Agent names (see :mod:`rag_gym.baselines`)."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra ``gym.make`` kwargs (``data_path``, ``corpus``, ``index``, ``k``…); plain JSON values."""
    batch_size: int = 8
    """Episodes stepped together (one batched agent call per step)."""
    lm_spec: str | None = None
    """The backend spec (``llama_cpp``, ``openai:model@url``…), recorded for re-runs."""
    out_dir: str = "runs"
    """Parent folder of the run folder."""
    run_name: str | None = None
    """Run folder name (default: ``<env>__<split>__<seed>__<unix time>``)."""

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

    @classmethod
    def from_run(cls, run_dir: str | Path, **overrides: Any) -> EvalConfig:
        """The config saved in a run folder's ``protocol.json`` (to reproduce the run)."""
        path = Path(run_dir) / "protocol.json"
        if not path.is_file():
            raise FileNotFoundError(
                f"{path} not found: expected a run folder written by rag-gym evaluate"
            )
        saved = json.loads(path.read_text())["config"]
        saved["agents"] = tuple(saved["agents"])
        return cls(**{**saved, **overrides})


@dataclass
class EvalResult:
    config: EvalConfig
    run_dir: Path
    rows: list[dict[str, Any]]
    episodes: list[dict[str, Any]]
    protocol: dict[str, Any]


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
            if kind == "search"
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


def run_agent(
    env_id: str,
    env_kwargs: dict[str, Any],
    agent: Agent,
    question_ids: list[str],
    seed: int,
    batch_size: int,
    progress: Callable[[int], None] | None = None,
) -> tuple[list[dict[str, Any]], float]:
    """Play ``agent`` on every question, ``batch_size`` episodes at a time.

    When the agent's language model batches concurrent callers (``lm.concurrent_clients``, the
    transformers backend), each of the ``batch_size`` slots plays its episodes on its own and
    the model keeps their requests in one running batch (``lm.run_clients``, one session per
    agent): a slot whose reply is done steps its env and sends its next prompt while the others
    are still generating. Otherwise every agent step is one batched call for all running
    episodes, and a step waits for its slowest reply.

    Returns the episode records (in question order) and the wall time. An agent or backend
    exception ends the episodes of that call as failed episodes (``error`` set); the run goes on.
    """
    kind = agent.env_kind
    n_slots = max(1, min(batch_size, len(question_ids)))
    envs = [gym.make(env_id, **env_kwargs) for _ in range(n_slots)]
    queue = list(enumerate(question_ids))
    records: dict[int, dict[str, Any]] = {}
    active: dict[int, dict[str, Any]] = {}
    done_count = 0
    t0 = time.perf_counter()

    def start(slot: int) -> None:
        order, qid = queue.pop(0)
        episode_seed = seed * 1_000_003 + order
        obs, info = envs[slot].reset(seed=episode_seed, options={"question_id": qid})
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
            "t0": time.perf_counter(),
        }

    def finish(slot: int, error: str | None = None) -> None:
        nonlocal done_count
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
        records[st["order"]] = rec
        done_count += 1
        if progress is not None:
            progress(done_count)

    def step(slot: int, action: Any) -> None:
        st = active[slot]
        try:
            obs, reward, terminated, truncated, info = envs[slot].step(action)
        except (TypeError, ValueError) as exc:  # an action outside the env's space
            finish(slot, f"{type(exc).__name__}: {exc}")
            return
        st.update(obs=obs, info=info, terminated=terminated, truncated=truncated)
        st["reward"] += float(reward)
        st["actions"].append(info.get("action_type") or kind.upper())
        if terminated or truncated:
            finish(slot)

    lm = getattr(agent, "lm", None)
    if getattr(lm, "concurrent_clients", False):

        def client(slot: int) -> Callable[[], None]:
            def play() -> None:
                while queue:
                    start(slot)
                    while slot in active:
                        st = active[slot]
                        try:
                            (action,) = agent.act_batch([st["obs"]], [st["info"]], [slot])
                        except Exception as exc:  # a failing agent or backend ends this episode
                            finish(slot, f"{type(exc).__name__}: {exc}")
                            break
                        step(slot, action)

            return play

        lm.run_clients([client(slot) for slot in range(n_slots)])
    else:
        while queue or active:
            for slot in range(n_slots):
                if slot not in active and queue:
                    start(slot)
            slots = sorted(active)
            try:
                actions = agent.act_batch(
                    [active[s]["obs"] for s in slots], [active[s]["info"] for s in slots], slots
                )
            except Exception as exc:  # a failing agent or LLM backend must not end the run
                for slot in slots:
                    finish(slot, f"{type(exc).__name__}: {exc}")
                continue
            for slot, action in zip(slots, actions, strict=True):
                step(slot, action)
    for env in envs:
        env.close()
    return [records[i] for i in sorted(records)], time.perf_counter() - t0


def _sub_em(episodes: list[dict[str, Any]]) -> float:
    """Mean sub-EM (Search-R1's ``subem_check``, FlashRAG's ``acc``) of the episodes' predictions:
    0.0 for an episode without one, and left out, as cover-EM is, where cover-EM is NaN."""
    vals = [
        metrics.sub_exact_match(e["prediction"], e["answers"]) if e.get("prediction") else 0.0
        for e in episodes
        if not (isinstance(e.get("cover_em"), float) and np.isnan(e["cover_em"]))
    ]
    return float(np.mean(vals)) if vals else float("nan")


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
) -> EvalResult:
    """Run every agent on the sampled questions, write the run folder and return the rows.

    ``agent_factory(name, env)`` builds an agent; ``progress(agent, done, total)`` is called per
    finished episode; ``judge(question, prediction, golds)`` (an LLM judge) adds a ``judge``
    accuracy; ``track`` logs to Weights & Biases (offline unless configured online).
    """
    base_env = gym.make(config.env_id, split=config.split, **config.env_kwargs)
    examples = base_env.unwrapped.examples
    indices = sample_indices(len(examples), config.n, config.seed)
    question_ids = [examples[i].id for i in indices]
    run_name = (
        config.run_name
        or f"{config.env_id.split('/')[-1]}__{config.split}__{config.seed}__{int(time.time())}"
    )
    run_dir = Path(config.out_dir) / run_name
    run_dir.mkdir(parents=True, exist_ok=True)
    unwrapped = base_env.unwrapped

    agents = {name: agent_factory(name, base_env) for name in config.agents}
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
        "corpus_size": len(unwrapped.corpus),
        "answer_metric": unwrapped.answer_metric,
        "max_episode_steps": base_env.spec.max_episode_steps if base_env.spec else None,
        "agents": {name: a.describe() for name, a in agents.items()},
        "lm": lm_description,
        "lm_spec": config.lm_spec,
        "batch_size": config.batch_size,
        "command": command,
        "config": {**asdict(config), "agents": list(config.agents)},
    }
    base_env.close()
    episodes: list[dict[str, Any]] = []
    rows = []
    for name, agent in agents.items():
        kind = agent_class(name).env_kind
        env_id = env_id_for(config.env_id, kind)
        kwargs = dict(config.env_kwargs)
        if kind != "search":
            kwargs.pop("k", None)
            kwargs.pop("exclude_seen", None)
        if kind == "tree":
            kwargs["prune"] = "none"
        kwargs["split"] = config.split
        # kept until the agent has played: its questions and index stay in the shared data cache,
        # so run_agent's copies reuse them instead of loading and indexing again
        probe = gym.make(env_id, **kwargs)
        available = {ex.id for ex in probe.unwrapped.examples}  # the reader skips unanswerable ones
        qids = [q for q in question_ids if q in available]
        tick = None
        if progress is not None:
            total = len(qids)

            def tick(done: int, name: str = name, total: int = total) -> None:
                progress(name, done, total)

        mine, seconds = run_agent(env_id, kwargs, agent, qids, config.seed, config.batch_size, tick)
        probe.close()
        for rec in mine:
            rec["agent"] = name
            rec["env_id"] = env_id
            if judge is not None and rec["prediction"] and rec["answerable"]:
                rec["judge"] = float(judge(rec["question"], rec["prediction"], rec["answers"]))
        episodes.extend(mine)
        rows.append(summarise(name, mine, seconds))
    result = EvalResult(config, run_dir, rows, episodes, protocol)
    write_run(result)
    if track:
        log_to_wandb(result)
    return result


def write_run(result: EvalResult) -> None:
    d = result.run_dir
    (d / "protocol.json").write_text(json.dumps(result.protocol, indent=2, default=str) + "\n")
    with open(d / "episodes.jsonl", "w", encoding="utf-8") as f:
        for e in result.episodes:
            f.write(json.dumps(e, ensure_ascii=False, default=str) + "\n")
    keys = [c[0] for c in COLUMNS]
    with open(d / "leaderboard.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        writer.writeheader()
        for row in result.rows:
            writer.writerow(row)
    (d / "leaderboard.md").write_text(leaderboard_markdown(result.rows) + "\n")
    write_plots(result.rows, d)


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

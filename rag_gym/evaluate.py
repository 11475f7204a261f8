"""Evaluate agents on an environment under one pinned protocol and build a leaderboard.

The protocol (env id, split, question sample, seed, retriever, k, corpus mode, model, prompt
versions) is written beside the results, so the numbers can be reproduced from the run folder.
Every agent plays the *same* sampled questions: ``n`` indices drawn without replacement by
``numpy.random.default_rng(seed)`` from the split, in sorted order.

Run folder contents: ``protocol.json``, ``episodes.jsonl`` (one record per episode),
``leaderboard.csv`` and ``leaderboard.md``.
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
from rag_gym.baselines import check_agent_name

#: leaderboard columns: (key, header, format)
COLUMNS = (
    ("agent", "agent", "{}"),
    ("em", "EM", "{:.3f}"),
    ("f1", "F1", "{:.3f}"),
    ("cover_em", "cover-EM", "{:.3f}"),
    ("recall", "recall", "{:.3f}"),
    ("full_recall", "full recall", "{:.3f}"),
    ("searches", "searches", "{:.2f}"),
    ("steps", "steps", "{:.2f}"),
    ("refusal_unanswerable", "refuse|unans.", "{}"),
    ("tokens", "tokens/ep", "{:.1f}"),
    ("seconds", "s/ep", "{:.3f}"),
    ("errors", "errors", "{}"),
    ("episodes", "episodes", "{}"),
)


@dataclass
class EvalConfig:
    """What to evaluate and how."""

    env_id: str = "rag_gym/SynthHop-v0"
    """A registered rag-gym env id."""
    split: str = "validation"
    """The split to draw questions from."""
    n: int = 100
    """Questions to sample (all of them when the split is smaller)."""
    seed: int = 0
    """Seed of the question sample, of env resets and of stochastic agents."""
    agents: tuple[str, ...] = ("naive_rag", "random")
    """Agent names (see :mod:`rag_gym.baselines`)."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra ``gym.make`` kwargs (``data_path``, ``corpus``, ``k``…); plain JSON values."""
    out_dir: str = "runs"
    """Parent folder of the run folder."""
    run_name: str | None = None
    """Run folder name (default: ``<env>__<split>__<seed>__<unix time>``)."""

    def __post_init__(self) -> None:
        if not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"expected n >= 1, got {self.n!r}")
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


def run_episode(env: gym.Env, agent: Agent, index: int, seed: int) -> dict[str, Any]:
    """Play one episode; an agent or backend exception ends it as a failed episode."""
    t0 = time.perf_counter()
    agent.reset(seed)
    obs, info = env.reset(seed=seed, options={"index": index})
    start_info = info
    actions: list[str] = []
    total_reward = 0.0
    terminated = truncated = False
    error = None
    last_info = info
    while not (terminated or truncated):
        try:
            action = agent.act(obs, info)
        except Exception as exc:  # a failing agent or LLM backend must not end the run
            error = f"{type(exc).__name__}: {exc}"
            break
        obs, reward, terminated, truncated, info = env.step(action)
        total_reward += reward
        actions.append(info["action_type"])
        last_info = info
    seconds = time.perf_counter() - t0
    gold = start_info["gold_ids"]
    retrieved = last_info["retrieved_history"]
    scores = last_info.get("scores") or {"em": 0.0, "f1": 0.0, "cover_em": 0.0}
    unwrapped = env.unwrapped
    example = unwrapped.examples[index]
    return {
        "question_id": start_info["question_id"],
        "question": start_info["question"],
        "answers": list(example.answers),
        "answerable": start_info["answerable"],
        "prediction": last_info.get("prediction"),
        "refused": bool(actions and actions[-1] == "REFUSE"),
        "em": scores["em"],
        "f1": scores["f1"],
        "cover_em": scores["cover_em"],
        "gold_ids": gold,
        "retrieved_ids": retrieved,
        "recall": metrics.recall_at_k(retrieved, gold) if gold else None,
        "full_recall": metrics.full_recall(retrieved, gold) if gold else None,
        "searches": last_info["num_searches"],
        "steps": last_info["step"],
        "actions": actions,
        "reward": total_reward,
        "terminated": terminated,
        "truncated": truncated,
        "prompt_tokens": agent.usage["prompt_tokens"],
        "completion_tokens": agent.usage["completion_tokens"],
        "seconds": seconds,
        "error": error,
    }


def summarise(agent: str, episodes: list[dict[str, Any]]) -> dict[str, Any]:
    """One leaderboard row from an agent's episodes."""

    def mean(key: str) -> float:
        vals = [e[key] for e in episodes if e[key] is not None]
        return float(np.mean(vals)) if vals else float("nan")

    unans = [e for e in episodes if not e["answerable"]]
    refused_unans = sum(e["refused"] for e in unans)
    return {
        "agent": agent,
        "em": mean("em"),
        "f1": mean("f1"),
        "cover_em": mean("cover_em"),
        "recall": mean("recall"),
        "full_recall": mean("full_recall"),
        "searches": mean("searches"),
        "steps": mean("steps"),
        "refusal_unanswerable": f"{refused_unans}/{len(unans)}" if unans else "-",
        "refusal_answerable": sum(e["refused"] for e in episodes if e["answerable"]),
        "tokens": float(np.mean([e["prompt_tokens"] + e["completion_tokens"] for e in episodes])),
        "seconds": mean("seconds"),
        "errors": sum(e["error"] is not None for e in episodes),
        "episodes": len(episodes),
    }


def evaluate(
    config: EvalConfig,
    agent_factory: Callable[[str], Agent],
    progress: Callable[[str, int], None] | None = None,
    lm_description: dict[str, Any] | None = None,
    command: str | None = None,
) -> EvalResult:
    """Run every agent on the sampled questions, write the run folder and return the rows.

    ``agent_factory(name)`` builds an agent; ``progress(agent, done)`` is called per episode;
    ``lm_description`` and ``command`` are recorded in the protocol.
    """
    env = gym.make(config.env_id, split=config.split, **config.env_kwargs)
    unwrapped = env.unwrapped
    indices = sample_indices(len(unwrapped.examples), config.n, config.seed)
    run_name = (
        config.run_name
        or f"{config.env_id.split('/')[-1]}__{config.split}__{config.seed}__{int(time.time())}"
    )
    run_dir = Path(config.out_dir) / run_name
    run_dir.mkdir(parents=True, exist_ok=True)

    agents = {name: agent_factory(name) for name in config.agents}
    protocol = {
        "rag_gym_version": rag_gym.__version__,
        "env_id": config.env_id,
        "env_kwargs": config.env_kwargs,
        "split": config.split,
        "seed": config.seed,
        "n": len(indices),
        "question_ids": [unwrapped.examples[i].id for i in indices],
        "question_indices": indices,
        "retriever": type(unwrapped.retriever).__name__,
        "k": unwrapped.k,
        "corpus_mode": unwrapped.corpus_mode,
        "corpus_size": len(unwrapped.corpus),
        "max_episode_steps": env.spec.max_episode_steps if env.spec else None,
        "answer_metric": unwrapped.answer_metric,
        "agents": {name: a.describe() for name, a in agents.items()},
        "lm": lm_description,
        "command": command,
    }
    episodes: list[dict[str, Any]] = []
    rows = []
    for name, agent in agents.items():
        mine = []
        for j, index in enumerate(indices):
            record = run_episode(env, agent, index, seed=config.seed * 1_000_003 + j)
            record["agent"] = name
            mine.append(record)
            if progress is not None:
                progress(name, j + 1)
        episodes.extend(mine)
        rows.append(summarise(name, mine))
    env.close()
    result = EvalResult(config, run_dir, rows, episodes, protocol)
    write_run(result)
    return result


def write_run(result: EvalResult) -> None:
    d = result.run_dir
    with open(d / "protocol.json", "w") as f:
        json.dump({**result.protocol, "config": asdict(result.config)}, f, indent=2, default=str)
    with open(d / "episodes.jsonl", "w", encoding="utf-8") as f:
        for e in result.episodes:
            f.write(json.dumps(e, ensure_ascii=False) + "\n")
    keys = [c[0] for c in COLUMNS]
    with open(d / "leaderboard.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        writer.writeheader()
        for row in result.rows:
            writer.writerow(row)
    (d / "leaderboard.md").write_text(leaderboard_markdown(result.rows) + "\n")


def format_cell(key: str, value: Any) -> str:
    fmt = next(f for k, _, f in COLUMNS if k == key)
    if isinstance(value, float) and np.isnan(value):
        return "-"
    return fmt.format(value)


def leaderboard_markdown(rows: list[dict[str, Any]]) -> str:
    header = "| " + " | ".join(h for _, h, _ in COLUMNS) + " |"
    sep = "|" + "|".join("---" for _ in COLUMNS) + "|"
    lines = [header, sep]
    for row in sorted(rows, key=lambda r: (-np.nan_to_num(r["em"]), -np.nan_to_num(r["f1"]))):
        lines.append("| " + " | ".join(format_cell(k, row[k]) for k, _, _ in COLUMNS) + " |")
    return "\n".join(lines)

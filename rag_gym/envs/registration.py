"""The rag-gym environment registry (Gymnasium ids ``rag_gym/<Name>-v<N>``).

Registration kwargs are plain JSON values, so ``gym.spec(id).to_json()`` round-trips. Ids of
real datasets need a local file (``data_path=...``) unless the dataset is on the hub (HotpotQA);
Bamboogle also needs ``corpus=...``.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

NAMESPACE = "rag_gym"
MAX_EPISODE_STEPS = 20  # EVO-RAG's horizon T_max (000-evo-rag.txt §3.2)

#: id → (entry point, kwargs, one-line description)
ENVS: dict[str, tuple[str, dict[str, Any], str]] = {
    "SynthHop-v0": (
        "rag_gym.envs.search:SearchEnv",
        {"dataset": "synthhop", "dataset_kwargs": {"preset": "default"}},
        "SynthHop 2-hop world (10k passages), full-corpus BM25, embedded",
    ),
    "SynthHop-Hard-v0": (
        "rag_gym.envs.search:SearchEnv",
        {"dataset": "synthhop", "dataset_kwargs": {"preset": "hard"}},
        "SynthHop 2-4 hops, 10% unanswerable (REFUSE is right), embedded",
    ),
    "HotpotQA-v0": (
        "rag_gym.envs.search:SearchEnv",
        {"dataset": "hotpotqa", "split": "validation"},
        "HotpotQA distractor: each question's 10 paragraphs (data_path= or the hub)",
    ),
    "2WikiMultiHopQA-v0": (
        "rag_gym.envs.search:SearchEnv",
        {"dataset": "2wikimultihopqa", "split": "validation"},
        "2WikiMultiHopQA: each question's 10 paragraphs (data_path=)",
    ),
    "MuSiQue-v0": (
        "rag_gym.envs.search:SearchEnv",
        {"dataset": "musique", "split": "validation"},
        "MuSiQue: each question's 20 paragraphs (data_path=)",
    ),
    "Bamboogle-v0": (
        "rag_gym.envs.search:SearchEnv",
        {"dataset": "bamboogle", "split": "test"},
        "Bamboogle 2-hop questions over a corpus you give (data_path=, corpus=)",
    ),
}


def register_envs() -> None:
    """Register every rag-gym id (idempotent)."""
    for name, (entry_point, kwargs, _) in ENVS.items():
        env_id = f"{NAMESPACE}/{name}"
        if env_id in gym.registry:
            continue
        gym.register(
            id=env_id,
            entry_point=entry_point,
            kwargs=kwargs,
            max_episode_steps=MAX_EPISODE_STEPS,
            disable_env_checker=False,
        )


def env_ids() -> list[str]:
    """Every registered rag-gym id."""
    return [f"{NAMESPACE}/{name}" for name in ENVS]

"""The rag-gym environment registry (Gymnasium ids ``rag_gym/<Name>-v<N>``).

Three kinds per dataset: the search env (``-v0``, :class:`~rag_gym.envs.SearchEnv`), R²AG's
retrieval-tree env (``-Tree-v0``, :class:`~rag_gym.envs.TreeSearchEnv`) and ARENA's reader env
(``-Reader-v0``, :class:`~rag_gym.envs.ReaderEnv`, where the dataset has passages).
The entry points are the env classes themselves and registration kwargs are plain JSON values,
so ``gym.spec(id).to_json()`` round-trips and ``gym.make(id, max_episode_steps=N)`` puts the
one ``TimeLimit`` of the env where Gymnasium puts it. A reward preset is a stack of wrappers
outside that limit (:func:`rag_gym.make`, :func:`rag_gym.wrappers.presets.apply`), so it shows in
``env.spec.additional_wrappers`` and ``gym.make(env.spec)`` builds it again. The search ids
have a native vector entry point (:class:`~rag_gym.envs.vector.SearchVectorEnv`, one process,
one batched ``retrieve`` per step): ``gym.make_vec(id, num_envs=N,
vectorization_mode="vector_entry_point")``. Ids of
real datasets need a local file (``data_path=...``) unless the dataset is on the hub (HotpotQA);
Bamboogle, NQ, TriviaQA and PopQA have no passages of their own and also need a corpus to search:
``corpus=`` (a JSONL file), ``index=`` (a saved index) or ``retriever=`` (a server URL). Any id
searches such a shared corpus instead of its questions' own paragraphs when given one (the
open-domain setting).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym

NAMESPACE = "rag_gym"
# EVO-RAG's horizon T_max (§3.2 of Ji et al., "Curriculum-Guided Reinforcement Learning for
# Efficient Multi-Hop Retrieval-Augmented Generation", arXiv:2505.17391).
MAX_EPISODE_STEPS = 20
# R²AG's L_MAX-I (§4.1 and appendix B.2 of "R²AG: Learning to Reason, Retrieve, and Self-Evolve
# through a Multi-Branch Retrieval Tree", anonymous submission under review, no arXiv id).
TREE_MAX_STEPS = 5

# The env classes (string references, imported only when an env is made).
_SEARCH = "rag_gym.envs.search:SearchEnv"
_TREE = "rag_gym.envs.tree:TreeSearchEnv"
_READER = "rag_gym.envs.reader:ReaderEnv"
_SEARCH_VECTOR = "rag_gym.envs.vector:SearchVectorEnv"


@dataclass(frozen=True)
class EnvEntry:
    name: str
    kind: str  # "search", "tree" or "reader"
    entry_point: str
    kwargs: dict[str, Any]
    max_episode_steps: int | None
    description: str
    vector_entry_point: str | None = None


_DATASETS = [
    # (id stem, dataset kwargs, has passages, short description of the data)
    (
        "SynthHop",
        {"dataset": "synthhop", "dataset_kwargs": {"preset": "default"}},
        True,
        "SynthHop 2-hop world, 10k passages, embedded",
    ),
    (
        "SynthHop-Hard",
        {"dataset": "synthhop-hard"},
        True,
        "SynthHop 2-4 hops, 10% unanswerable, embedded",
    ),
    (
        "HotpotQA",
        {"dataset": "hotpotqa", "split": "validation"},
        True,
        "HotpotQA distractor, 10 paragraphs per question (data_path= or the hub)",
    ),
    (
        "2WikiMultiHopQA",
        {"dataset": "2wikimultihopqa", "split": "validation"},
        True,
        "2WikiMultiHopQA, 10 paragraphs per question (data_path=)",
    ),
    (
        "MuSiQue",
        {"dataset": "musique", "split": "validation"},
        True,
        "MuSiQue, 20 paragraphs per question (data_path=)",
    ),
    (
        "Bamboogle",
        {"dataset": "bamboogle", "split": "test"},
        False,
        "Bamboogle over a corpus you give (data_path=, corpus=)",
    ),
    (
        "NQ",
        {"dataset": "nq", "split": "test"},
        False,
        "Natural Questions, FlashRAG JSONL, over a corpus you give (data_path=, corpus=)",
    ),
    (
        "TriviaQA",
        {"dataset": "triviaqa", "split": "test"},
        False,
        "TriviaQA, FlashRAG JSONL, over a corpus you give (data_path=, corpus=)",
    ),
    (
        "PopQA",
        {"dataset": "popqa", "split": "test"},
        False,
        "PopQA, FlashRAG JSONL, over a corpus you give (data_path=, corpus=)",
    ),
]


def _entries() -> list[EnvEntry]:
    out = []
    for stem, kwargs, has_passages, desc in _DATASETS:
        out.append(
            EnvEntry(
                f"{stem}-v0",
                "search",
                _SEARCH,
                kwargs,
                MAX_EPISODE_STEPS,
                f"search/answer/refuse, k=3 — {desc}",
                _SEARCH_VECTOR,
            )
        )
        out.append(
            EnvEntry(
                f"{stem}-Tree-v0",
                "tree",
                _TREE,
                kwargs,
                TREE_MAX_STEPS,
                f"R²AG retrieval tree, top-1 per query — {desc}",
            )
        )
        if has_passages:
            reader_kwargs = {key: val for key, val in kwargs.items()}
            out.append(
                EnvEntry(
                    f"{stem}-Reader-v0",
                    "reader",
                    _READER,
                    reader_kwargs,
                    None,
                    f"ARENA reader over the question's own pool — {desc}",
                )
            )
    return out


ENTRIES: list[EnvEntry] = _entries()


def register_envs() -> None:
    """Register every rag-gym id (idempotent)."""
    for entry in ENTRIES:
        env_id = f"{NAMESPACE}/{entry.name}"
        if env_id in gym.registry:
            continue
        gym.register(
            id=env_id,
            entry_point=entry.entry_point,
            kwargs=entry.kwargs,
            max_episode_steps=entry.max_episode_steps,
            vector_entry_point=entry.vector_entry_point,
        )


def env_ids(kind: str | None = None) -> list[str]:
    """Every registered rag-gym id (of one kind: ``search``, ``tree`` or ``reader``)."""
    return [f"{NAMESPACE}/{e.name}" for e in ENTRIES if kind is None or e.kind == kind]

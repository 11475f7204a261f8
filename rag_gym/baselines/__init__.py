"""Baseline agents, by name: ``make_agent("naive_rag", lm=...)``.

| name | needs an LM | what it does |
|------|-------------|--------------|
| ``naive_rag`` | yes | one search with the question, answer from the top-k passages |
| ``random`` | no | uniformly random valid actions |
"""

from __future__ import annotations

import difflib
from typing import Any

from rag_gym.agents.base import Agent

#: name → (module, class, needs an LM)
AGENTS: dict[str, tuple[str, str, bool]] = {
    "naive_rag": ("rag_gym.baselines.naive_rag", "NaiveRAG", True),
    "random": ("rag_gym.baselines.random", "RandomAgent", False),
}


def check_agent_name(name: str) -> str:
    if not isinstance(name, str):
        raise TypeError(f"expected an agent name (str), got {type(name).__name__}")
    if name not in AGENTS:
        close = difflib.get_close_matches(name, AGENTS, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"expected an agent in {sorted(AGENTS)}, got {name!r}{hint}")
    return name


def needs_lm(name: str) -> bool:
    return AGENTS[check_agent_name(name)][2]


def make_agent(name: str, lm: Any = None, seed: int = 0) -> Agent:
    """Build the agent ``name``; LLM agents need ``lm`` (a :class:`~rag_gym.agents.LanguageModel`)."""
    import importlib

    module, cls, uses_lm = AGENTS[check_agent_name(name)]
    klass = getattr(importlib.import_module(module), cls)
    if uses_lm:
        if lm is None:
            raise ValueError(
                f"agent {name!r} needs a language model: pass lm=LlamaCppLM() (or another backend)"
            )
        return klass(lm)
    return klass(seed=seed)

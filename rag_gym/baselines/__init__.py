"""Baseline agents and the papers' methods, by name: ``make_agent("ircot", lm=...)``.

| name | env | LLM calls | what it does |
|------|-----|-----------|--------------|
| ``random`` | search | 0 | uniformly random valid actions |
| ``direct`` | search | 1 | answers from the model's knowledge, no search |
| ``cot`` | search | 1 | chain-of-thought, then answer, no search |
| ``naive_rag`` | search | 1 | one search with the question, answer from the passages |
| ``ircot`` | search | ≤ 4 | reasoning sentences interleaved with searches |
| ``self_ask`` | search | ≤ 9 | follow-up questions with intermediate answers |
| ``react`` | search | ≤ 6 | Thought / Search[...] / Finish[...] |
| ``iter_retgen`` | search | 3 | three rounds of search with the previous answer draft |
| ``oracle`` | search | 1 | reads the gold passages (an upper bound for the reader) |
| ``evo_rag`` | text | ≤ 8 | EVO-RAG's four-action query rewriter |
| ``eval_rar`` | text | ≤ 5 | Eval-RAR's search, evaluate, answer |
| ``lwts`` | text | ≤ 4 | LWTS: internal knowledge first, search when needed |
| ``r2ag`` | tree | ≤ 5 | R²AG's base / predicted queries with Top-Survivor |
| ``arena`` | reader | 1 | ARENA's relevance / analysis / answer reader |
| ``search_r1`` | text | ≤ 8 | the trained-policy protocol: tags through ``TextActions`` |

``search_r1`` takes a checkpoint after a colon: ``search_r1:synthhop`` is the shipped SynthHop
agent (a LoRA adapter over the embedded SmolLM2, see :mod:`rag_gym.agents.search_r1`),
``search_r1:PATH`` a LoRA adapter folder, a training run folder, or a ``.gguf`` adapter, applied
to the base model it was trained on (its record's ``base`` or ``model``:
:func:`~rag_gym.agents.provenance.recorded_base`) on the evaluation's backend (``--lm``): the
backend's default model gives way to that base, and a model the user named that is not it is
refused, naming both (:class:`~rag_gym.generation.adapters.AdapterError`). The agent writes the
tag preset the checkpoint was trained with (its ``rag_gym.json`` or run ``config.json``;
``search_r1`` where neither says), and renders chats with the template it was trained with
unless the backend names one.
"""

from __future__ import annotations

import importlib
from typing import Any

from rag_gym._names import unknown_name
from rag_gym.agents.base import Agent

#: name → (module, class, needs an LM)
AGENTS: dict[str, tuple[str, str, bool]] = {
    "random": ("rag_gym.baselines.random", "RandomAgent", False),
    "direct": ("rag_gym.baselines.direct", "DirectAnswer", True),
    "cot": ("rag_gym.baselines.direct", "ChainOfThought", True),
    "naive_rag": ("rag_gym.baselines.naive_rag", "NaiveRAG", True),
    "ircot": ("rag_gym.baselines.ircot", "IRCoT", True),
    "self_ask": ("rag_gym.baselines.self_ask", "SelfAsk", True),
    "react": ("rag_gym.baselines.react", "ReAct", True),
    "iter_retgen": ("rag_gym.baselines.iter_retgen", "IterRetGen", True),
    "oracle": ("rag_gym.baselines.oracle", "OracleReader", True),
    "evo_rag": ("rag_gym.baselines.papers", "EvoRagAgent", True),
    "eval_rar": ("rag_gym.baselines.papers", "EvalRarAgent", True),
    "lwts": ("rag_gym.baselines.papers", "LWTSAgent", True),
    "r2ag": ("rag_gym.baselines.papers", "R2AGAgent", True),
    "arena": ("rag_gym.baselines.papers", "ArenaAgent", True),
    "search_r1": ("rag_gym.agents.search_r1", "SearchR1Agent", True),
}
#: agents that take a checkpoint after a colon (``search_r1:synthhop``)
WITH_CHECKPOINT = ("search_r1",)


def split_agent_name(name: str) -> tuple[str, str | None]:
    """``"search_r1:synthhop"`` → ``("search_r1", "synthhop")``; ``"cot"`` → ``("cot", None)``."""
    base, colon, arg = name.partition(":")
    return base, (arg if colon else None)


def check_agent_name(name: str) -> str:
    if not isinstance(name, str):
        raise TypeError(f"expected an agent name (str), got {type(name).__name__}")
    base, arg = split_agent_name(name)
    if base not in AGENTS:
        raise unknown_name("agent", base, AGENTS)
    if arg is not None and base not in WITH_CHECKPOINT:
        raise ValueError(
            f"expected a checkpoint only after {', '.join(WITH_CHECKPOINT)}, got {name!r}: "
            f"write {base!r}"
        )
    if arg is not None and not arg:
        raise ValueError(
            f"expected a checkpoint after the colon, got {name!r}: e.g. 'search_r1:synthhop'"
        )
    return name


def needs_lm(name: str) -> bool:
    return AGENTS[split_agent_name(check_agent_name(name))[0]][2]


def agent_class(name: str) -> type[Agent]:
    module, cls, _ = AGENTS[split_agent_name(check_agent_name(name))[0]]
    return getattr(importlib.import_module(module), cls)


def make_agent(
    name: str, lm: Any = None, seed: int = 0, env: Any = None, prompt: str | None = None
) -> Agent:
    """Build the agent ``name``; LLM agents need ``lm``; the oracle reads ``env``'s corpus.
    ``prompt`` (a template with ``{question}``) goes to the agents that take one (``search_r1``
    and its checkpoints); the others keep their own prompts."""
    klass = agent_class(name)
    if not needs_lm(name):
        return klass(seed=seed)
    if lm is None:
        raise ValueError(
            f"agent {name!r} needs a language model: pass lm=LlamaCppLM() (or another backend)"
        )
    if name == "oracle":
        return klass(lm, corpus=env.unwrapped.corpus if env is not None else None)
    checkpoint = split_agent_name(name)[1]
    if checkpoint is not None:
        from rag_gym.agents.provenance import recorded_chat_template
        from rag_gym.agents.search_r1 import checkpoint_path, checkpoint_tags

        path = checkpoint_path(checkpoint)
        lm = on_trained_base(lm, path, name)
        # the tag preset it was trained with (evo_rag for a refusing policy), else the default
        extra = {"prompt": prompt} if prompt is not None and _takes_prompt(klass) else {}
        named = getattr(lm, "chat_template_option", None) is not None
        template = None if named else recorded_chat_template(path)
        # a user's own backend may take the adapter alone: the template only when there is one
        adapted = (
            lm.with_adapter(path, chat_template=template) if template else lm.with_adapter(path)
        )
        agent = klass(
            adapted,
            tags=checkpoint_tags(path) or "search_r1",
            **extra,
        )
        agent.name = name
        return agent
    if prompt is not None and _takes_prompt(klass):
        return klass(lm, prompt=prompt)
    return klass(lm)


def on_trained_base(lm: Any, checkpoint: Any, name: str) -> Any:
    """``lm``, or the same backend on the base model ``checkpoint`` was trained on where that
    is another model and ``lm`` runs its default one. ``AdapterError`` where the user named
    another model than the base, naming both; ``lm`` unchanged where the checkpoint records no
    base (an adapter from elsewhere) or the backend cannot say what it runs."""
    from rag_gym.agents.provenance import recorded_base
    from rag_gym.generation.adapters import AdapterError
    from rag_gym.generation.lm import same_model

    base = recorded_base(checkpoint)
    current = getattr(lm, "model_id", None)
    if base is None or current is None or same_model(current, base):
        return lm
    if getattr(lm, "model_named", True):
        raise AdapterError(
            f"{name} was trained on the base model {base}, but the evaluation's LM runs "
            f"{current}: an adapter only fits its own base. Leave the model out of --lm (the "
            f"base is loaded), or name it: --lm llama_cpp:{base}"
        )
    return lm.with_model(base)


def _takes_prompt(klass: type) -> bool:
    import inspect

    return "prompt" in inspect.signature(klass.__init__).parameters

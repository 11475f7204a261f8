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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rag_gym._registry import Registry, caller_origin
from rag_gym.agents.base import Agent


@dataclass(frozen=True)
class AgentSpec:
    """An agent that :func:`make_agent` builds by name."""

    agent: type[Agent] | str
    """Its class, or ``"module:Class"`` (imported when first built)."""
    needs_lm: bool = True
    """Whether it is built on a language model (``--lm``)."""
    checkpoint: bool = False
    """Whether its name takes a checkpoint after a colon (``search_r1:RUN``)."""
    build: Callable[..., Agent] | None = None
    """``build(cls, *, name, lm, seed, env, prompt, checkpoint) -> Agent``, where the class's
    constructor is not enough; ``None``: ``cls(seed=seed)`` without an LM, ``cls(lm)`` (with
    ``prompt=`` where it takes one) with one, and a checkpoint applied as ``search_r1``'s is."""
    description: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.agent, str | type):
            raise TypeError(
                f"expected an agent class or 'module:Class', got {type(self.agent).__name__}"
            )

    def cls(self) -> type[Agent]:
        if isinstance(self.agent, type):
            return self.agent
        module, _, attr = self.agent.partition(":")
        return getattr(importlib.import_module(module), attr)


def _as_agent(name: str, value: Any) -> AgentSpec:
    if isinstance(value, AgentSpec):
        return value
    if isinstance(value, type) and issubclass(value, Agent):
        from rag_gym.agents.llm_agent import LLMAgent

        return AgentSpec(value, needs_lm=issubclass(value, LLMAgent))
    raise TypeError(f"expected an Agent subclass or an AgentSpec, got {value!r}")


AGENTS: Registry[AgentSpec] = Registry("agent", "rag_gym.agents", _as_agent)
"""Every agent by name (a :class:`~rag_gym._registry.Registry`)."""


def register_agent(
    name: str, agent: AgentSpec | type[Agent], *, replace: bool = False
) -> AgentSpec:
    """Register an agent as ``name`` (an :class:`~rag_gym.agents.base.Agent` subclass, which
    needs an LM when it is an :class:`~rag_gym.agents.llm_agent.LLMAgent`, or an
    :class:`AgentSpec`): ``make_agent`` and ``rag-gym evaluate --agents NAME`` then build it. An
    installed package registers one through an entry point in the group ``rag_gym.agents``.

    >>> AGENTS.get("random").needs_lm, AGENTS.get("search_r1").checkpoint
    (False, True)
    """
    if isinstance(name, str) and "," in name:
        raise ValueError(
            f"expected an agent name without ',' (it separates --agents), got {name!r}"
        )
    return AGENTS.register(name, agent, replace=replace, origin=caller_origin())


def split_agent_name(name: str) -> tuple[str, str | None]:
    """``"search_r1:synthhop"`` → ``("search_r1", "synthhop")``; ``"cot"`` → ``("cot", None)``."""
    base, colon, arg = name.partition(":")
    return base, (arg if colon else None)


def check_agent_name(name: str) -> str:
    if not isinstance(name, str):
        raise TypeError(f"expected an agent name (str), got {type(name).__name__}")
    base, arg = split_agent_name(name)
    spec = AGENTS.get(base)
    if arg is not None and not spec.checkpoint:
        with_checkpoint = [n for n, s in AGENTS.registered().items() if s.checkpoint]
        raise ValueError(
            f"expected a checkpoint only after {', '.join(with_checkpoint)}, got {name!r}: "
            f"write {base!r}"
        )
    if arg is not None and not arg:
        raise ValueError(
            f"expected a checkpoint after the colon, got {name!r}: e.g. 'search_r1:synthhop'"
        )
    return name


def agent_spec(name: str) -> AgentSpec:
    """The :class:`AgentSpec` of ``name`` (a checkpoint after a colon allowed)."""
    return AGENTS.get(split_agent_name(check_agent_name(name))[0])


def needs_lm(name: str) -> bool:
    return agent_spec(name).needs_lm


def agent_class(name: str) -> type[Agent]:
    return agent_spec(name).cls()


def make_agent(
    name: str, lm: Any = None, seed: int = 0, env: Any = None, prompt: str | None = None
) -> Agent:
    """Build the agent ``name``; LLM agents need ``lm``; the oracle reads ``env``'s corpus.
    ``prompt`` (a template with ``{question}``) goes to the agents that take one (``search_r1``
    and its checkpoints); the others keep their own prompts."""
    spec = agent_spec(name)
    klass = spec.cls()
    if spec.needs_lm and lm is None:
        raise ValueError(
            f"agent {name!r} needs a language model: pass lm=LlamaCppLM() (or another backend)"
        )
    checkpoint = split_agent_name(name)[1]
    build = spec.build or (_with_checkpoint if checkpoint is not None else _plain)
    return build(
        klass,
        name=name,
        lm=lm if spec.needs_lm else None,
        seed=seed,
        env=env,
        prompt=prompt,
        checkpoint=checkpoint,
    )


def _plain(klass: type, *, name, lm, seed, env, prompt, checkpoint) -> Agent:
    if lm is None:
        return klass(seed=seed)
    if prompt is not None and _takes_prompt(klass):
        return klass(lm, prompt=prompt)
    return klass(lm)


def _oracle(klass: type, *, name, lm, seed, env, prompt, checkpoint) -> Agent:
    return klass(lm, corpus=env.unwrapped.corpus if env is not None else None)


def _with_checkpoint(klass: type, *, name, lm, seed, env, prompt, checkpoint) -> Agent:
    """``klass`` on ``lm`` with the checkpoint's adapter, on the base model it was trained on,
    writing the tags and rendering chats with the template it was trained with."""
    from rag_gym.agents.provenance import recorded_chat_template
    from rag_gym.agents.search_r1 import checkpoint_path, checkpoint_tags

    path = checkpoint_path(checkpoint)
    lm = on_trained_base(lm, path, name)
    # the tag preset it was trained with (evo_rag for a refusing policy), else the default
    extra = {"prompt": prompt} if prompt is not None and _takes_prompt(klass) else {}
    named = getattr(lm, "chat_template_option", None) is not None
    template = None if named else recorded_chat_template(path)
    # a user's own backend may take the adapter alone: the template only when there is one
    adapted = lm.with_adapter(path, chat_template=template) if template else lm.with_adapter(path)
    agent = klass(adapted, tags=checkpoint_tags(path) or "search_r1", **extra)
    agent.name = name
    return agent


for _name, _target, _lm in (
    ("random", "rag_gym.baselines.random:RandomAgent", False),
    ("direct", "rag_gym.baselines.direct:DirectAnswer", True),
    ("cot", "rag_gym.baselines.direct:ChainOfThought", True),
    ("naive_rag", "rag_gym.baselines.naive_rag:NaiveRAG", True),
    ("ircot", "rag_gym.baselines.ircot:IRCoT", True),
    ("self_ask", "rag_gym.baselines.self_ask:SelfAsk", True),
    ("react", "rag_gym.baselines.react:ReAct", True),
    ("iter_retgen", "rag_gym.baselines.iter_retgen:IterRetGen", True),
    ("oracle", "rag_gym.baselines.oracle:OracleReader", True),
    ("evo_rag", "rag_gym.baselines.papers:EvoRagAgent", True),
    ("eval_rar", "rag_gym.baselines.papers:EvalRarAgent", True),
    ("lwts", "rag_gym.baselines.papers:LWTSAgent", True),
    ("r2ag", "rag_gym.baselines.papers:R2AGAgent", True),
    ("arena", "rag_gym.baselines.papers:ArenaAgent", True),
    ("search_r1", "rag_gym.agents.search_r1:SearchR1Agent", True),
):
    AGENTS.register(
        _name,
        AgentSpec(
            _target,
            needs_lm=_lm,
            checkpoint=_name == "search_r1",
            build=_oracle if _name == "oracle" else None,
        ),
        origin="rag-gym",
    )


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

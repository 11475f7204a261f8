"""``LLMAgent``: the base of prompted agents — at most one LLM call per env step, batched.

A subclass writes three methods:

* ``start(obs, info) -> dict``: the per-episode state, made at the episode's first step;
* ``decide(state, obs, info) -> Action | Prompt``: either the action outright (no LLM needed,
  e.g. a first search with the question; a text action as a :class:`TextAction`) or a prompt
  (a chat message list or a string);
* ``parse(state, text, obs, info) -> Action``: the action for the model's reply. It must always
  return a valid action (falling back on something sensible), so a garbage or empty reply never
  breaks an episode; it sets ``state["bad_reply"] = True`` when it had to fall back (an empty
  reply always counts), and the evaluator reports those as ``bad replies``.

``act_batch`` gathers the prompts of every slot that needs one, makes one
``lm.generate`` call for all of them, and counts tokens per slot. A backend exception
propagates to the caller (the evaluator scores those episodes as failed and goes on). A prompt
that fills the model's context window is not an exception: its reply is empty (a bad reply)
and ``state["context_full"]`` is set, so that an agent whose prompts only grow can end the
episode (``search_r1`` answers its give-up answer).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from rag_gym.agents.base import Agent
from rag_gym.envs.search import ActionType
from rag_gym.envs.spaces import sanitize
from rag_gym.generation.lm import CONTEXT_FULL, GenerationConfig, LanguageModel
from rag_gym.wrappers.text_actions import format_passages


class LLMAgent(Agent):
    """Prompted agent with per-slot state (see the module doc)."""

    prompt_version = "v1"
    max_tokens = 64
    stop: tuple[str, ...] = ()

    def __init__(self, lm: LanguageModel, max_tokens: int | None = None) -> None:
        super().__init__()
        if not isinstance(lm, LanguageModel):
            raise TypeError(f"expected a rag_gym LanguageModel, got {type(lm).__name__}")
        self.lm = lm
        # the model's options (--max-new-tokens, --temperature) over the agent's own
        self.config = lm.agent_config(
            GenerationConfig(
                max_tokens=max_tokens or self.max_tokens, temperature=0.0, stop=self.stop
            )
        )
        if max_tokens is not None:  # given for this agent: it wins
            self.config = replace(self.config, max_tokens=max_tokens)
        # every agent here prompts with chat messages: a model that cannot render them is
        # refused now, before a run starts, not episode by episode
        lm.check_chat()
        self._states: dict[int, dict[str, Any]] = {}

    def on_reset(self, slot: int, seed: int | None) -> None:
        self._states.pop(slot, None)

    # -- to implement --
    def start(self, obs: Any, info: dict[str, Any]) -> dict[str, Any]:
        return {"question": info.get("question", ""), "steps": 0}

    def decide(self, state: dict[str, Any], obs: Any, info: dict[str, Any]) -> Any:
        raise NotImplementedError

    def parse(self, state: dict[str, Any], text: str, obs: Any, info: dict[str, Any]) -> Any:
        raise NotImplementedError

    # -- the batched driver --
    def act_batch(
        self, observations: Sequence[Any], infos: Sequence[dict[str, Any]], slots: Sequence[int]
    ) -> list:
        actions: list[Any] = [None] * len(slots)
        pending: list[tuple[int, dict[str, Any], Any]] = []
        for i, (obs, info, slot) in enumerate(zip(observations, infos, slots, strict=True)):
            state = self._states.get(slot)
            if state is None:
                state = self._states[slot] = self.start(obs, info)
            decision = self.decide(state, obs, info)
            state["steps"] = state.get("steps", 0) + 1
            if _is_prompt(decision):
                pending.append((i, state, decision))
            else:
                actions[i] = decision
        if pending:
            generations = self.lm.generate([p for _, _, p in pending], self.config)
            for (i, state, _), gens in zip(pending, generations, strict=True):
                gen = gens[0]
                usage = self.usage_of(slots[i])
                usage["prompt_tokens"] += gen.prompt_tokens
                usage["completion_tokens"] += gen.completion_tokens
                state["bad_reply"] = not (gen.text or "").strip()
                if gen.error and gen.error.startswith(CONTEXT_FULL):
                    state["context_full"] = True
                self._raw_outputs[slots[i]] = gen.text or ""
                actions[i] = self.parse(state, gen.text or "", observations[i], infos[i])
                usage["bad_replies"] += int(state.pop("bad_reply"))
        return actions

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "env_kind": self.env_kind,
            "prompt_version": f"{self.name}/{self.prompt_version}",
            "lm": self.lm.describe(),
            "max_tokens": self.config.max_tokens,
            # sampled (--temperature); greedy runs, the default, record nothing
            **({"temperature": self.config.temperature} if self.config.temperature else {}),
        }


class TextAction(str):
    """A text action (for an agent that plays through ``TextActions``) decided without the
    model: ``decide`` may return one, where a plain ``str`` would be a prompt."""


def _is_prompt(decision: Any) -> bool:
    if isinstance(decision, TextAction):
        return False
    return isinstance(decision, str) or (
        isinstance(decision, list)
        and decision
        and isinstance(decision[0], dict)
        and "role" in decision[0]
    )


def passages_text(passages: Sequence[dict[str, str]], start: int = 1) -> str:
    """Numbered passages as ``[i] Title: text`` lines (the prompt baselines' style of
    :func:`rag_gym.wrappers.text_actions.format_passages`, the one passage renderer)."""
    return format_passages(passages, style="numbered", start=start)


def user_message(content: str) -> list[dict[str, str]]:
    """A prompt of one user message, ``content``."""
    return [{"role": "user", "content": content}]


def first_line(text: str) -> str:
    return next((ln.strip() for ln in text.strip().splitlines() if ln.strip()), "")


def clean_answer(text: str) -> str:
    """First non-empty line, without an ``Answer:`` prefix, quotes or a final full stop.

    >>> clean_answer("Answer: \\"Velmora\\".\\nBecause ...")
    'Velmora'
    """
    line = first_line(text)
    for prefix in ("so the answer is:", "so the answer is", "final answer:", "answer:", "a:"):
        if line.lower().startswith(prefix):
            line = line[len(prefix) :].strip()
    return line.rstrip(". ").strip("\"'` ").rstrip(". ")[:200]


def search(query: str) -> dict[str, Any]:
    """A SEARCH action with the model's query, sanitised and cut to the env's query limit."""
    return {"type": ActionType.SEARCH, "text": sanitize(" ".join(query.split()))[:500] or "?"}


def note(text: str) -> dict[str, Any]:
    """An EVALUATE action with the model's note, sanitised and cut to the env's limit."""
    return {"type": ActionType.EVALUATE, "text": sanitize(" ".join(text.split()))[:500] or "-"}


def answer(text: str) -> dict[str, Any]:
    """An ANSWER action with the cleaned, sanitised answer (``unknown`` when empty)."""
    return {"type": ActionType.ANSWER, "text": sanitize(clean_answer(text)) or "unknown"}

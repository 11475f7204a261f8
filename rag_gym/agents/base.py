"""The agent interface: episodes in slots, one batched call per step.

An agent plays one episode per *slot*. ``reset(seed, slot)`` starts an episode in a slot;
``act_batch(observations, infos, slots)`` returns one action per given slot, so an evaluator can
step many episodes with one call (and LLM agents make one batched generation call for them).
``act(observation, info)`` is the single-episode shortcut (slot 0). ``usage_of(slot)`` counts the
tokens spent in a slot's current episode and its ``bad_replies`` (empty or unparsable model
output that the agent replaced by a fallback action); ``usage`` is slot 0's.
``take_raw_output(slot)`` hands over, once, the model's raw reply behind a slot's last action
(``None`` when the action needed no model), which the evaluator records in its step traces.

Agents declare the env kind they play (``env_kind``: ``"search"``, ``"tree"`` or ``"reader"``);
actions are what that env takes (a ``Dict`` for the search env, text for the others).
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any


class Agent(abc.ABC):
    """Base class of every agent and baseline."""

    name: str = "agent"
    env_kind: str = "search"

    def __init__(self) -> None:
        self._usage: dict[int, dict[str, int]] = {}
        self._raw_outputs: dict[int, str] = {}

    def reset(self, seed: int | None = None, slot: int = 0) -> None:
        """Start a new episode in ``slot`` (clears that slot's state and token counts)."""
        self._usage[slot] = {"prompt_tokens": 0, "completion_tokens": 0, "bad_replies": 0}
        self.on_reset(slot, seed)

    def on_reset(self, slot: int, seed: int | None) -> None:  # noqa: B027 (optional hook)
        """Subclasses clear their per-slot state here."""

    def usage_of(self, slot: int) -> dict[str, int]:
        return self._usage.setdefault(
            slot, {"prompt_tokens": 0, "completion_tokens": 0, "bad_replies": 0}
        )

    def take_raw_output(self, slot: int) -> str | None:
        """The model's raw reply behind ``slot``'s last action, once (``None`` when there is
        none: a rule-based action, or already taken)."""
        return self.__dict__.get("_raw_outputs", {}).pop(slot, None)

    @property
    def usage(self) -> dict[str, int]:
        return self.usage_of(0)

    def act(self, observation: Any, info: dict[str, Any]) -> Any:
        """The next action of the episode in slot 0."""
        return self.act_batch([observation], [info], [0])[0]

    @abc.abstractmethod
    def act_batch(
        self, observations: Sequence[Any], infos: Sequence[dict[str, Any]], slots: Sequence[int]
    ) -> list:
        """One action per slot."""

    def describe(self) -> dict[str, Any]:
        """What the evaluator records in a run's protocol (name, prompt version, model)."""
        return {"name": self.name, "env_kind": self.env_kind}

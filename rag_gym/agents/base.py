"""The agent interface: reset, then act on each observation.

An agent maps the env's text observation and ``info`` to a ``SearchEnv`` action dict
(``{"type": ActionType, "text": str}``). ``act_batch`` is the path evaluation uses to step many
episodes per call; the default loops over ``act``, and LLM agents override it to batch
generation. ``usage`` counts the tokens the agent spent in the current episode.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any


class Agent(abc.ABC):
    """Base class of every agent and baseline."""

    name: str = "agent"

    def __init__(self) -> None:
        self.usage = {"prompt_tokens": 0, "completion_tokens": 0}

    def reset(self, seed: int | None = None) -> None:
        """Start a new episode (clears per-episode state and token counts)."""
        self.usage = {"prompt_tokens": 0, "completion_tokens": 0}

    @abc.abstractmethod
    def act(self, observation: str, info: dict[str, Any]) -> dict[str, Any]:
        """The next action for this observation."""

    def act_batch(
        self, observations: Sequence[str], infos: Sequence[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        return [self.act(o, i) for o, i in zip(observations, infos, strict=True)]

    def describe(self) -> dict[str, Any]:
        """What the evaluator records in a run's protocol (name, prompt version, model)."""
        return {"name": self.name}

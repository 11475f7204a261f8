"""Random agent: a uniformly random meaningful action each step (a floor for every metric).

Each step it draws an action type uniformly among those ``info["action_mask"]`` allows; a
SEARCH uses 1-4 random words of the observation, an ANSWER 1-3 random words, an EVALUATE a
fixed note. Seeded: ``RandomAgent(seed)`` and ``reset(seed, slot)`` make it reproducible, per
slot.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from rag_gym.agents.base import Agent
from rag_gym.envs.search import ActionType

_WORD = re.compile(r"[A-Za-z0-9][\w'-]*")


class RandomAgent(Agent):
    """Uniformly random valid actions."""

    name = "random"

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        self.seed = seed
        self._rngs: dict[int, np.random.Generator] = {}

    def on_reset(self, slot: int, seed: int | None) -> None:
        self._rngs[slot] = np.random.default_rng([self.seed, seed if seed is not None else 0])

    def _words(self, rng: np.random.Generator, observation: str, lo: int, hi: int) -> str:
        words = _WORD.findall(observation) or ["unknown"]
        n = int(rng.integers(lo, hi + 1))
        return " ".join(words[int(i)] for i in rng.integers(0, len(words), size=n))

    def act_batch(self, observations, infos, slots) -> list[dict[str, Any]]:
        actions = []
        for observation, info, slot in zip(observations, infos, slots, strict=True):
            rng = self._rngs.setdefault(slot, np.random.default_rng([self.seed, 0]))
            mask = np.asarray(info.get("action_mask", np.ones(len(ActionType))), dtype=bool)
            choices = np.flatnonzero(mask)
            atype = ActionType(int(choices[int(rng.integers(0, len(choices)))]))
            if atype == ActionType.SEARCH:
                text = self._words(rng, observation, 1, 4)
            elif atype == ActionType.ANSWER:
                text = self._words(rng, observation, 1, 3)
            elif atype == ActionType.EVALUATE:
                text = "The evidence so far may be incomplete."
            else:
                text = ""
            actions.append({"type": atype, "text": text})
        return actions

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "env_kind": self.env_kind, "seed": self.seed}

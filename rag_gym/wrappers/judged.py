"""An LLM judge's verdict as a reward term, for the answers that exact match under-scores.

Exact match gives 0 to "Bill Clinton" against the gold "William Jefferson Clinton", and F1 only
part of it. :class:`JudgedAnswerReward` asks a judge (``judge(question, prediction, golds) ->
bool``; :class:`rag_gym.generation.judges.LLMAnswerJudge`, any backend, with its cache) about the
answers the env's own answer term scores below 1, and only those: an answer EM already accepts
costs no call. A "yes" adds the rest of the way to 1, so the step's answer reward becomes 1; a
"no" adds nothing. An answer to an unanswerable question, a refusal and a step that does not
answer are never judged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym

from rag_gym.wrappers.base import RewardTerm

Judge = Callable[[str, str, Sequence[str]], bool]


class JudgedAnswerReward(RewardTerm):
    """``weight × (1 − answer term)`` on an answer the judge accepts (see the module doc).

    ``info["judge"]`` holds the verdict on the steps the judge was asked (absent otherwise);
    ``info["reward_raw"]["judge"]`` is ``1 − answer term`` when it said yes, else 0."""

    name = "judge"

    def __init__(self, env: gym.Env, judge: Judge, weight: float = 1.0) -> None:
        if not callable(judge):
            raise TypeError(
                f"expected judge to be callable(question, prediction, golds) -> bool, got "
                f"{type(judge).__name__}"
            )
        super().__init__(env, weight=weight)
        self.judge = judge
        self._verdict: bool | None = None

    def step(self, action: Any):
        self._verdict = None
        obs, reward, terminated, truncated, info = super().step(action)
        if self._verdict is not None:
            info["judge"] = self._verdict
        return obs, reward, terminated, truncated, info

    def term(
        self, action: Any, obs: Any, terminated: bool, truncated: bool, info: dict[str, Any]
    ) -> float:
        prediction = info.get("prediction")
        if not terminated or not prediction or "scores" not in info:
            return 0.0
        example = self.env.unwrapped.current_example
        if not example.answerable:
            return 0.0
        answer_term = float(info.get("reward_terms", {}).get("answer", 0.0))
        if answer_term >= 1.0:
            return 0.0
        self._verdict = bool(self.judge(example.question, prediction, list(example.answers)))
        return 1.0 - answer_term if self._verdict else 0.0

"""LLM judges that plug into the reward wrappers.

* :class:`LLMSufficiencyJudge` — EVO-RAG's evidence verifier (EVO-RAG, arXiv:2505.17391, §3.2: "the
  judgement of an external LLM verifier ... returns enough_evidence ∈ {yes, no}"), for
  :class:`rag_gym.wrappers.RefusalReward`'s ``verifier``.
* :class:`LLMAnswerJudge` — LWTS's LLM-as-judge correctness ("Learning When to Search:
  Multi-Stage Reward Design for Efficient Agentic RAG with Reasoning Language Models", §3.3,
  LasJ), for
  :class:`rag_gym.wrappers.MultiStageAnswerReward` through
  ``rag_gym.rewards.core.Correctness("judge", judge)``.

Both take any :class:`~rag_gym.generation.LanguageModel` (an OpenAI-compatible server's model, or
the embedded SmolLM2 for tests), decode greedily, and read a leading yes/no. Called as a reward
term, a reply with neither, or a backend error, counts as "no" (and is counted in ``errors``),
so a flaky judge never stops a training run. :meth:`LLMAnswerJudge.verdict`, which the evaluator
calls, raises instead: the backend's own error, or :class:`NoVerdictError` for a reply that is
neither yes nor no, and the evaluator records the verdict as missing. Each counts its ``calls``
and the ``seconds`` they took.

:class:`LLMAnswerJudge` also serves :class:`rag_gym.wrappers.JudgedAnswerReward` (the judge as a
reward term during training) and keeps a cache of its verdicts, keyed by the question and the
normalised prediction and gold answers (:func:`rag_gym.metrics.normalize_answer`): a GRPO group
that writes the same answer several times asks once (``cache_hits``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from rag_gym._text import shown
from rag_gym.generation.lm import GenerationConfig, LanguageModel
from rag_gym.metrics import normalize_answer

SUFFICIENCY_PROMPT = (
    "Question: {question}\n\nEvidence:\n{evidence}\n\n"
    "Is this evidence enough to answer the question? Reply with yes or no."
)
ANSWER_PROMPT = (
    "Question: {question}\nGold answers: {golds}\nPredicted answer: {prediction}\n\n"
    "Does the predicted answer mean the same as one of the gold answers? Reply with yes or no."
)


class NoVerdictError(ValueError):
    """A judge's reply that says neither yes nor no (or is not text at all)."""


class _YesNoJudge:
    def __init__(self, lm: LanguageModel, max_tokens: int = 4) -> None:
        if not isinstance(lm, LanguageModel):
            raise TypeError(f"expected a rag_gym LanguageModel, got {type(lm).__name__}")
        self.lm = lm
        self.config = GenerationConfig(max_tokens=max_tokens, temperature=0.0)
        self.errors = 0
        self.calls = 0
        self.seconds = 0.0

    def _verdict(self, prompt: str) -> bool:
        """The judge's yes (``True``) or no; raises the backend's error, or
        :class:`NoVerdictError` for a reply that is neither (each counted in ``errors``)."""
        self.calls += 1
        start = time.perf_counter()
        try:
            (gens,) = self.lm.generate([[{"role": "user", "content": prompt}]], self.config)
        except Exception:
            self.errors += 1
            raise
        finally:
            self.seconds += time.perf_counter() - start
        text = gens[0].text
        if not isinstance(text, str):
            self.errors += 1
            raise NoVerdictError(
                f"expected the judge's reply to be text, got {type(text).__name__} "
                f"{shown(repr(text), 80)}"
            )
        reply = text.strip().lower()
        if reply.startswith("yes"):
            return True
        if reply.startswith("no"):
            return False
        self.errors += 1
        raise NoVerdictError(f"expected the judge to reply yes or no, got {shown(repr(text), 80)}")

    def _ask(self, prompt: str) -> bool:
        """:meth:`_verdict`, with a failure taken as "no": a judge failure must not end a
        training run."""
        try:
            return self._verdict(prompt)
        except Exception:
            return False


class LLMSufficiencyJudge(_YesNoJudge):
    """``judge(question, evidence_passages, info) -> bool``: is the evidence enough?"""

    def __call__(
        self, question: str, evidence: Sequence[Any], info: dict[str, Any] | None = None
    ) -> bool:
        lines = [
            f"[{i}] {getattr(p, 'title', '')}: {getattr(p, 'text', p)}"
            for i, p in enumerate(evidence, 1)
        ]
        return self._ask(
            SUFFICIENCY_PROMPT.format(question=question, evidence="\n".join(lines) or "(none)")
        )


class LLMAnswerJudge(_YesNoJudge):
    """``judge(question, prediction, golds) -> bool``: does the prediction match a gold answer?

    ``cache``: keep each verdict (see the module doc); a backend error is not kept, so the same
    answer is asked again."""

    def __init__(self, lm: LanguageModel, max_tokens: int = 4, cache: bool = True) -> None:
        super().__init__(lm, max_tokens=max_tokens)
        self.cache: dict[tuple, bool] | None = {} if cache else None
        self.cache_hits = 0

    def __call__(self, question: str, prediction: str, golds: Sequence[str]) -> bool:
        """:meth:`verdict`, with a judge that gives none taken as "no" (a reward term)."""
        try:
            return self.verdict(question, prediction, golds)
        except Exception:
            return False

    def verdict(self, question: str, prediction: str, golds: Sequence[str]) -> bool:
        """Whether ``prediction`` matches one of ``golds``. Raises the backend's error
        (``ConnectionError``, ``TimeoutError``, :class:`~rag_gym.generation.lm.BackendError`…)
        or :class:`NoVerdictError` when the judge gives no verdict; such a failure is not
        cached, so the same answer is asked again."""
        key = (
            question,
            normalize_answer(prediction),
            tuple(sorted({normalize_answer(g) for g in golds})),
        )
        if self.cache is not None and key in self.cache:
            self.cache_hits += 1
            return self.cache[key]
        verdict = self._verdict(
            ANSWER_PROMPT.format(question=question, golds="; ".join(golds), prediction=prediction)
        )
        if self.cache is not None:
            self.cache[key] = verdict
        return verdict

    def stats(self) -> dict[str, float]:
        """Calls to the backend, cache hits, errors and the seconds the calls took."""
        return {
            "calls": self.calls,
            "cache_hits": self.cache_hits,
            "errors": self.errors,
            "seconds": round(self.seconds, 3),
        }

"""TRL-style reward functions: ``fn(completions, **columns) -> list[float | None]``.

They score whole generated trajectories (a string, or TRL's conversational form — a list of
messages, whose assistant turns are joined) with the same formulas as the env wrappers
(:mod:`rag_gym.rewards.core`). Dataset columns arrive as keyword lists, one entry per
completion: ``answer`` (a string or a list of aliases), ``gold_references`` (ARENA),
``question``. A completion that cannot be scored (a missing column entry) gets ``None``,
which TRL skips.

Terms that need the retrieval environment (EVO-RAG's step terms, R²AG's tree rewards) are
scored by the env wrappers during the rollout; :func:`episode_return` passes the env's return
through, so a trainer mixes both kinds the same way.

>>> exact_match_reward(["<think>..</think><answer>Paris</answer>", "<answer>Lyon</answer>"], answer=["Paris", "Paris"])
[1.0, 0.0]
>>> arena_reward(["<relevance>[1, 5]</relevance><analysis>x</analysis><answer>Paris</answer>"],
...              answer=["paris"], gold_references=[[1, 5]])
[13.0]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from rag_gym.envs.reader import parse_relevance
from rag_gym.envs.tags import parse
from rag_gym.rewards import core


def completion_text(completion: str | list[dict[str, Any]]) -> str:
    """The text of a completion: a string as is; TRL's conversational form, the assistant
    turns joined with newlines."""
    if isinstance(completion, str):
        return completion
    return "\n".join(
        str(m.get("content", "")) for m in completion if m.get("role", "assistant") == "assistant"
    )


def _golds(answer: str | Sequence[str] | None) -> list[str] | None:
    if answer is None:
        return None
    return [answer] if isinstance(answer, str) else list(answer)


def _column(values: Sequence[Any] | None, name: str, n: int) -> list[Any]:
    if values is None:
        return [None] * n
    values = list(values)
    if len(values) != n:
        raise ValueError(
            f"expected column {name!r} to have one entry per completion ({n}), got {len(values)}"
        )
    return values


def last_tag(text: str, name: str) -> str | None:
    """The content of the last complete ``<name>…</name>`` block, else None."""
    tags = [t for t in parse(text, names=frozenset({name})).tags if t.name == name]
    return tags[-1].content if tags else None


def _answer_scores(completions: list, answer: list | None, score) -> list[float | None]:
    """``score(text, golds)`` per completion; ``None`` where its ``answer`` entry is missing."""
    return [
        None if gold is None else score(completion_text(completion), _golds(gold))
        for completion, gold in zip(
            completions, _column(answer, "answer", len(completions)), strict=True
        )
    ]


def exact_match_reward(
    completions: list, answer: list | None = None, **columns: Any
) -> list[float | None]:
    """Exact match of the last ``<answer>`` block (Eval-RAR's R_ans, ARENA's accuracy)."""
    return _answer_scores(
        completions,
        answer,
        lambda text, golds: core.eval_rar_answer(last_tag(text, "answer"), golds),
    )


def _reader_parts(text: str) -> tuple[list[str], list[int], str | None]:
    parsed = parse(text, names=frozenset(core.READER_ORDER))
    first: list[str] = []
    for t in parsed.tags:
        if t.name not in first:
            first.append(t.name)
    rel = next((t.content for t in parsed.tags if t.name == "relevance"), None)
    ans = next((t.content for t in parsed.tags if t.name == "answer"), None)
    return first, parse_relevance(rel) if rel is not None else [], ans


def arena_reward(
    completions: list,
    answer: list | None = None,
    gold_references: list | None = None,
    **columns: Any,
) -> list[float | None]:
    """ARENA's total: format + accuracy + relevance + bonus (§3.3)."""
    n = len(completions)
    out: list[float | None] = []
    for completion, gold, refs in zip(
        completions,
        _column(answer, "a", n),
        _column(gold_references, "r", n),
        strict=True,
    ):
        if gold is None or refs is None:
            out.append(None)
            continue
        order, relevance, prediction = _reader_parts(completion_text(completion))
        f = core.arena_format(order)
        a = core.arena_accuracy(prediction, _golds(gold))
        r = core.arena_relevance(relevance, refs)
        out.append(f + a + r + core.arena_bonus(f, a, r))
    return out


def eval_rar_reward(
    completions: list,
    answer: list | None = None,
    r_eval: float = core.EVAL_RAR_R_EVAL,
    **columns: Any,
) -> list[float | None]:
    """Eval-RAR's R_total (eq. 5) over a whole trajectory with ``<evaluate>`` blocks."""

    def score(text: str, golds: list[str]) -> float:
        evaluations = [t.content for t in parse(text, names=frozenset({"evaluate"})).tags]
        r_ans = core.eval_rar_answer(last_tag(text, "answer"), golds)
        return core.eval_rar_total(r_ans, core.eval_rar_evaluation(evaluations, golds, r_eval))

    return _answer_scores(completions, answer, score)


_LWTS_TAGS = frozenset({"think", "search", "information", "reflect", "answer"})


def lwts_format_reward(completions: list, **columns: Any) -> list[float]:
    """LWTS's r_f (eq. 6) over the trajectory's tag sequence."""
    return [
        core.lwts_format(parse(completion_text(c), names=_LWTS_TAGS).names()) for c in completions
    ]


def lwts_answer_reward(
    completions: list,
    answer: list | None = None,
    stage: int = 1,
    correctness: str | core.Correctness = "em",
    question: list | None = None,
    **columns: Any,
) -> list[float | None]:
    """LWTS's r_a (eqs. 10-11) with RC = the number of ``<search>`` blocks."""
    judge = (
        correctness if isinstance(correctness, core.Correctness) else core.Correctness(correctness)
    )
    n = len(completions)
    out: list[float | None] = []
    for completion, gold, q in zip(
        completions, _column(answer, "a", n), _column(question, "q", n), strict=True
    ):
        golds = _golds(gold)
        if golds is None:
            out.append(None)
            continue
        text = completion_text(completion)
        rc = sum(1 for t in parse(text, names=frozenset({"search"})).tags if t.name == "search")
        out.append(core.lwts_answer(judge(q or "", last_tag(text, "answer"), golds), rc, stage))
    return out


def lwts_search_reward(
    completions: list,
    encoder: Callable | None = None,
    normalization: str = "printed",
    **columns: Any,
) -> list[float]:
    """LWTS's r_s (eq. 9) over the trajectory's ``<search>`` queries."""
    out = []
    for completion in completions:
        queries = [
            t.content for t in parse(completion_text(completion), names=frozenset({"search"})).tags
        ]
        avg = 0.0
        if len(queries) > 1:
            if encoder is None:
                from rag_gym.retrieval.encoders import default_encoder

                encoder = default_encoder()
            avg = core.lwts_avg_sim(np.asarray(encoder(queries)), normalization)
        out.append(core.lwts_search(queries, avg))
    return out


def episode_return(
    completions: list, episode_return: list | None = None, **columns: Any
) -> list[float | None]:
    """The return an env-side reward stack computed during the rollout (a dataset column)."""
    return [None if r is None else float(r) for r in _column(episode_return, "r", len(completions))]

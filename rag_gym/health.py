"""Trajectory health: what went wrong inside an episode, beside its score.

Six flags per episode, read from its step trace (the schema of :mod:`rag_gym.traces`) and how it
ended. They are what search-agent trainers watch inside trajectories (repeated queries,
unparsable tool calls, truncation), where a policy that games its reward shows first:

| flag | set when |
|---|---|
| ``repeated_query`` | a SEARCH's query, lowercased with its whitespace folded, is one the episode searched before |
| ``unparsable`` | a step's action was malformed (the env's invalid-action penalty; ``invalid`` in the trace) |
| ``truncated`` | a limit ended the episode before it answered or refused (the step limit, a token budget, the turns) |
| ``answered_unsearched`` | the episode answered without having searched |
| ``over_long`` | a reply used the whole per-turn token budget (unknown, ``None``, without the budget) |
| ``refused_with_gold`` | the episode refused after its searches had retrieved every gold passage |

:func:`episode_flags` sets them for one episode; :func:`rates` gives a batch's share of
episodes with each flag; :func:`summary` puts those shares in one short text. ``rag-gym evaluate`` records the flags in each episode record
(``health``) and puts the rates in the leaderboard (``health_<flag>``); the GRPO trainer logs them
every step (``health/<flag>``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

#: the flags, in the order the leaderboard shows them
FLAGS = (
    "repeated_query",
    "unparsable",
    "truncated",
    "answered_unsearched",
    "over_long",
    "refused_with_gold",
)

#: each flag's name in one-line summaries (:func:`summary`)
LABELS = {
    "repeated_query": "repeated query",
    "unparsable": "unparsable",
    "truncated": "truncated",
    "answered_unsearched": "answered unsearched",
    "over_long": "over-long",
    "refused_with_gold": "refused with gold",
}

_SPACE = re.compile(r"\s+")


def episode_flags(
    steps: Sequence[Mapping[str, Any]],
    ended: str | None,
    truncated: bool,
    gold_ids: Iterable[str] = (),
    max_turn_tokens: int | None = None,
) -> dict[str, bool | None]:
    """The health flags of one episode.

    Args:
        steps: its step trace (:func:`rag_gym.traces.step_record`'s records).
        ended: the action type that ended it (``"ANSWER"``, ``"REFUSE"``…), ``None`` if none.
        truncated: whether a limit cut it before it answered or refused.
        gold_ids: its gold passages (none: ``refused_with_gold`` is never set).
        max_turn_tokens: the new tokens a reply may have; ``None``: ``over_long`` is unknown.

    >>> search = {"action": "SEARCH", "text": "Who  founded X", "invalid": False,
    ...           "completion_tokens": 12, "retrieved": [{"id": "p1", "gold": True}]}
    >>> again = {**search, "text": "who founded x"}
    >>> flags = episode_flags([search, again, {"action": "REFUSE", "text": "",
    ...     "invalid": False, "completion_tokens": 5, "retrieved": []}], "REFUSE", False, ["p1"])
    >>> flags["repeated_query"], flags["refused_with_gold"], flags["over_long"]
    (True, True, None)
    """
    queries: set[str] = set()
    repeated = searched = False
    found: set[str] = set()
    for step in steps:
        if step.get("action") == "SEARCH" and not step.get("invalid"):
            searched = True
            query = _SPACE.sub(" ", str(step.get("text", ""))).strip().lower()
            repeated = repeated or query in queries
            queries.add(query)
        found.update(str(r["id"]) for r in step.get("retrieved") or () if r.get("gold"))
    gold = {str(g) for g in gold_ids}
    over_long = (
        None
        if not max_turn_tokens
        else any(int(s.get("completion_tokens") or 0) >= max_turn_tokens for s in steps)
    )
    return {
        "repeated_query": repeated,
        "unparsable": any(bool(s.get("invalid")) for s in steps),
        "truncated": bool(truncated),
        "answered_unsearched": ended == "ANSWER" and not searched,
        "over_long": over_long,
        "refused_with_gold": ended == "REFUSE" and bool(gold) and gold <= found,
    }


def rates(flags: Iterable[Mapping[str, bool | None] | None]) -> dict[str, float]:
    """Each flag's share of the episodes where it is known (``nan`` where it is known for
    none); episodes without flags (``None``: failed ones) are left out.

    >>> rates([{"truncated": True}, {"truncated": False}, None])["truncated"]
    0.5
    """
    known: dict[str, list[bool]] = {flag: [] for flag in FLAGS}
    for episode in flags:
        if not episode:
            continue
        for flag in FLAGS:
            value = episode.get(flag)
            if value is not None:
                known[flag].append(bool(value))
    return {
        flag: (sum(values) / len(values) if values else math.nan) for flag, values in known.items()
    }


def summary(shares: Mapping[str, float]) -> str:
    """The flags raised, in one short text: the flag of the largest share of episodes with its
    share, and how many other flags are raised (``"over-long 0.15 +1"``); ``"none"`` when every
    known flag is clear, ``"-"`` when none is known (every episode failed).

    ``shares`` maps flags to :func:`rates`' values, or a leaderboard row's ``health_<flag>``
    values (its other keys are ignored).

    >>> summary({"truncated": 0.1, "over_long": 0.25, "unparsable": 0.0})
    'over-long 0.25 +1'
    >>> summary({"health_truncated": 0.0, "health_over_long": float("nan")})
    'none'
    """
    known: dict[str, float] = {}
    for flag in FLAGS:
        value = shares.get(flag, shares.get(f"health_{flag}"))
        if isinstance(value, (int, float)) and not math.isnan(value):
            known[flag] = float(value)
    if not known:
        return "-"
    raised = sorted(
        (flag for flag, share in known.items() if share > 0),
        key=lambda f: (-known[f], FLAGS.index(f)),
    )
    if not raised:
        return "none"
    top = f"{LABELS[raised[0]]} {known[raised[0]]:.2f}"
    return top if len(raised) == 1 else f"{top} +{len(raised) - 1}"

"""Trajectory health: each flag set by a trajectory that should set it and cleared by one that
should not; the rates; the evaluator's records, leaderboard columns and report."""

from __future__ import annotations

import json
import math

import pytest

from rag_gym.health import FLAGS, episode_flags, rates


def step(action: str, text: str = "", invalid: bool = False, tokens: int = 10, gold=()):
    retrieved = [{"id": g, "rank": 1, "gold": True} for g in gold]
    return {
        "action": action,
        "text": text,
        "invalid": invalid,
        "completion_tokens": tokens,
        "retrieved": retrieved,
    }


#: flag -> (a trajectory that sets it, one that clears it); each is episode_flags' arguments
CASES = {
    "repeated_query": (
        ([step("SEARCH", "Who founded  Acme?"), step("SEARCH", "who founded acme?")], "ANSWER"),
        ([step("SEARCH", "who founded Acme?"), step("SEARCH", "where is Acme?")], "ANSWER"),
    ),
    "unparsable": (
        ([step("SEARCH", "q"), step("ACT", "<answr>x", invalid=True)], "ANSWER"),
        ([step("SEARCH", "q"), step("ANSWER", "x")], "ANSWER"),
    ),
    "answered_unsearched": (
        ([step("ANSWER", "x")], "ANSWER"),
        ([step("SEARCH", "q"), step("ANSWER", "x")], "ANSWER"),
    ),
    "over_long": (
        ([step("SEARCH", "q", tokens=128)], "ANSWER"),
        ([step("SEARCH", "q", tokens=127)], "ANSWER"),
    ),
    "refused_with_gold": (
        ([step("SEARCH", "q", gold=["g1", "g2"]), step("REFUSE")], "REFUSE"),
        ([step("SEARCH", "q", gold=["g1"]), step("REFUSE")], "REFUSE"),  # g2 never found
    ),
}


@pytest.mark.parametrize("flag", list(CASES))
def test_a_trajectory_sets_its_flag_and_another_clears_it(flag):
    (set_steps, set_end), (clear_steps, clear_end) = CASES[flag]
    kw = {"gold_ids": ["g1", "g2"], "max_turn_tokens": 128}
    flagged = episode_flags(set_steps, set_end, False, **kw)
    clean = episode_flags(clear_steps, clear_end, False, **kw)
    assert flagged[flag] is True and clean[flag] is False
    # the trajectory that sets one flag sets no other (each flag is its own signal)
    assert [f for f in FLAGS if flagged[f]] == [flag]


def test_truncated_and_unknown_flags():
    steps = [step("SEARCH", "q"), step("SEARCH", "r")]
    assert episode_flags(steps, "SEARCH", True)["truncated"] is True
    assert episode_flags(steps, "ANSWER", False)["truncated"] is False
    assert episode_flags(steps, "ANSWER", False)["over_long"] is None  # no budget: unknown
    # an invalid SEARCH is not a search: answering after it answered unsearched
    bad = [step("SEARCH", "q", invalid=True), step("ANSWER", "x")]
    assert episode_flags(bad, "ANSWER", False)["answered_unsearched"] is True
    # without gold passages a refusal is never "with gold"
    assert episode_flags([step("REFUSE")], "REFUSE", False)["refused_with_gold"] is False


def test_rates_leave_out_unknown_and_failed_episodes():
    a = episode_flags([step("ANSWER", "x", tokens=200)], "ANSWER", False, max_turn_tokens=128)
    b = episode_flags([step("SEARCH", "q"), step("ANSWER", "x")], "ANSWER", False)
    out = rates([a, b, None])
    assert out["answered_unsearched"] == 0.5 and out["over_long"] == 1.0  # b's is unknown
    assert out["truncated"] == 0.0 and set(out) == set(FLAGS)
    assert all(math.isnan(v) for v in rates([None]).values())


def test_evaluate_records_the_flags_and_the_leaderboard_rates(tmp_path):
    from rag_gym.baselines import make_agent
    from rag_gym.evaluate import evaluate
    from rag_gym.view import build_report
    from tests.conftest import EchoLM
    from tests.test_evaluate import config

    result = evaluate(
        config(tmp_path, n=6), lambda name, env: make_agent(name, lm=EchoLM(reply="x"), seed=1)
    )
    episodes = [json.loads(line) for line in (tmp_path / "run" / "episodes.jsonl").open()]
    assert all(set(e["health"]) == set(FLAGS) for e in episodes)
    naive = [e for e in episodes if e["agent"] == "naive_rag"]
    # naive RAG searches once, then answers: nothing repeated, unsearched or cut
    assert all(
        not (e["health"]["repeated_query"] or e["health"]["answered_unsearched"])
        and not e["health"]["truncated"]
        for e in naive
    )
    rows = {r["agent"]: r for r in result.rows}
    for agent in ("naive_rag", "random"):
        mine = [e["health"] for e in episodes if e["agent"] == agent]
        for flag in FLAGS:
            known = [f[flag] for f in mine if f[flag] is not None]
            expected = sum(known) / len(known) if known else math.nan
            got = rows[agent][f"health_{flag}"]
            assert got == expected or (math.isnan(got) and math.isnan(expected))
    board = (tmp_path / "run" / "leaderboard.md").read_text()
    assert "repeated query" in board and "refused with gold" in board
    report = build_report(tmp_path / "run").read_text()
    assert "answered unsearched" in report


def test_summary_names_the_most_frequent_flag_and_counts_the_others():
    from rag_gym.health import summary

    assert summary({"truncated": 0.1, "over_long": 0.25, "unparsable": 0.0}) == "over-long 0.25 +1"
    assert summary({"truncated": 0.1}) == "truncated 0.10"
    # a tie goes to the flag shown first in the leaderboard
    assert summary({"over_long": 0.2, "repeated_query": 0.2}) == "repeated query 0.20 +1"
    # a leaderboard row's health_<flag> values; other keys are ignored
    row = {"agent": "x", "em": 0.5, "health_answered_unsearched": 0.4, "health_truncated": 0.0}
    assert summary(row) == "answered unsearched 0.40"
    assert summary({flag: 0.0 for flag in FLAGS}) == "none"
    # unknown everywhere (every episode failed): nothing to report, not "none"
    assert summary({flag: math.nan for flag in FLAGS}) == "-" and summary({}) == "-"

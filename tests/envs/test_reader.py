"""ReaderEnv: ARENA's structured reading (§3.1)."""

from __future__ import annotations

import gymnasium as gym
import pytest

import rag_gym  # noqa: F401
from rag_gym.data import Passage, QAExample
from rag_gym.envs import ReaderEnv
from rag_gym.envs.reader import parse_relevance
from tests.conftest import shared_file

POOL = tuple(Passage(f"p{i}", f"T{i}", f"text {i}") for i in range(1, 7))
Q = QAExample("q1", "Who?", ("Ada Vell",), ("p5", "p1"), POOL, hops=2)


def make_env(**kwargs) -> ReaderEnv:
    return ReaderEnv(examples=[Q], **kwargs)


def test_relevance_1_5_is_parsed_to_1_5():
    env = make_env()
    obs, info = env.reset()
    assert info["gold_references"] == [1, 5] and info["num_references"] == 6
    assert "<references>\n[1] T1: text 1\n" in obs and "[6] T6: text 6\n</references>" in obs
    action = "<relevance>[1, 5]</relevance>\n<analysis>[1] and [5] say so.</analysis>\n<answer>ada vell</answer>"
    obs, reward, term, trunc, info = env.step(action)
    assert info["relevance"] == [1, 5] and info["format_ok"] and info["prediction"] == "ada vell"
    assert (obs, reward, term, trunc) == ("", 1.0, True, False) and info["scores"]["em"] == 1.0


@pytest.mark.parametrize(
    ("action", "relevance", "format_ok", "prediction"),
    [
        ("<analysis>a</analysis><relevance>[1]</relevance><answer>x</answer>", [1], False, "x"),
        ("<relevance>[2,3]</relevance><answer>x</answer>", [2, 3], False, "x"),
        ("just an answer", [], False, None),
        (
            "<relevance>none</relevance><analysis>-</analysis><answer>Ada Vell</answer>",
            [],
            True,
            "Ada Vell",
        ),
    ],
)
def test_format_and_partial_outputs(action, relevance, format_ok, prediction):
    env = make_env()
    env.reset()
    _, reward, term, _, info = env.step(action)
    assert (
        info["relevance"] == relevance
        and info["format_ok"] is format_ok
        and info["prediction"] == prediction
    )
    assert term and reward == (1.0 if prediction == "Ada Vell" else 0.0)


def test_parse_relevance():
    assert parse_relevance("[1, 5]") == [1, 5]
    assert parse_relevance("[3][1] 3") == [3, 1]
    assert parse_relevance("") == []


def test_one_step_only_and_type_errors():
    env = make_env()
    env.reset()
    with pytest.raises(TypeError, match=r"expected the action to be the model's text \(str\)"):
        env.step(["<answer>x</answer>"])
    env.step("<answer>x</answer>")
    with pytest.raises(RuntimeError, match="one step per question"):
        env.step("<answer>x</answer>")


def test_unanswerable_and_poolless_questions_are_skipped():
    env = ReaderEnv(
        examples=[
            Q,
            QAExample("q2", "?", ("y",), (), POOL, answerable=False),
            QAExample("q3", "?", ("z",)),
        ]
    )
    assert [ex.id for ex in env.examples] == ["q1"]


@pytest.mark.shared_data
def test_musique_reader_shows_20_references_and_gold_numbers():
    env = gym.make(
        "rag_gym/MuSiQue-Reader-v0", data_path=str(shared_file("musique/musique_ans_dev_100.jsonl"))
    )
    obs, info = env.reset(seed=0)
    assert info["num_references"] == 20 and "[20] " in obs
    ex = env.unwrapped._example
    ids = [p.id for p in ex.passages]
    assert info["gold_references"] == sorted(ids.index(g) + 1 for g in ex.supporting_ids)
    assert len(info["gold_references"]) == ex.hops


def test_render_shows_references_and_output(capsys):
    env = make_env(render_mode="ansi")
    env.reset()
    assert env.render().startswith("Answer the question using the numbered references")
    env.step("<answer>x</answer>")
    assert env.render().endswith("Model output:\n<answer>x</answer>")
    human = make_env(render_mode="human")
    human.reset()
    human.step("<answer>y</answer>")
    assert "Model output:\n<answer>y</answer>" in capsys.readouterr().out


def test_a_relevance_number_past_the_int_string_limit_is_an_invalid_action():
    import sys

    digits = "9" * (sys.get_int_max_str_digits() + 1)
    with pytest.raises(ValueError, match=f"a number of {len(digits)} digits"):
        parse_relevance(f"[1, {digits}]")
    env = make_env()
    env.reset()
    action = f"<relevance>[1, {digits}]</relevance><analysis>-</analysis><answer>Ada Vell</answer>"
    obs, reward, term, trunc, info = env.step(action)
    assert (obs, reward, term, trunc) == ("", 0.0, True, False)
    assert info["invalid_action"] and f"{len(digits)} digits" in info["message"]
    assert info["relevance"] == [] and info["relevance_found"] and not info["format_ok"]
    assert info["prediction"] is None
    env.reset()
    _, reward, _, _, info = env.step(ReaderEnv.format_action([1, 5], "-", "Ada Vell"))
    assert reward == 1.0 and not info["invalid_action"] and info["message"] == ""

"""rag_gym.make: the one place an env stack (preset, extra terms, text actions) is assembled."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import rag_gym
from rag_gym.wrappers import (
    AnswerCorrectnessReward,
    DropBaseReward,
    EvaluationReward,
    JudgedAnswerReward,
    LWTSFormatReward,
    LWTSSearchReward,
    MultiStageAnswerReward,
    RefusalReward,
    StepCost,
    TextActions,
)
from rag_gym.wrappers.presets import with_text_actions

KW = {"split": "validation", "dataset_kwargs": {"n_passages": 2000, "n_questions": [40, 10, 10]}}


def judge_by_length(question, prediction, golds):
    return len(prediction) > 3


def stub_encoder(texts):
    return np.array([[len(t), t.count(" ") + 1.0] for t in texts])


def chain(env):
    names = []
    while isinstance(env, gym.Wrapper):
        names.append(type(env).__name__)
        env = env.env
    return names


def play(env, turns, index):
    """Per step: the observation, reward, flags and reward terms of ``turns`` on a question."""
    obs, info = env.reset(seed=3, options={"question_index": index})
    gold = env.unwrapped.current_example.answer
    out = [obs]
    for turn in turns:
        obs, reward, terminated, truncated, info = env.step(turn.format(q=info["question"], a=gold))
        out.append((obs, reward, terminated, truncated, info["reward_terms"]))
        if terminated or truncated:
            break
    return out


EVAL_RAR_TURNS = [
    "<evaluate>not yet</evaluate><search>{q}</search>",
    "<backtrack/>",
    "<search>{q}</search>",
    "<answer>{a}</answer>",
]


def test_make_builds_the_stack_a_trainer_built_by_hand():
    """Preset, extra terms (step cost, refusal, a shared judge) and TextActions: the same
    wrappers in the same order, the same spec, the same observations and per-step rewards."""
    by_hand = gym.make("rag_gym/SynthHop-v0", **KW)
    by_hand = EvaluationReward(AnswerCorrectnessReward(DropBaseReward(by_hand), metric="em"))
    by_hand = StepCost(by_hand, weight=0.1)
    by_hand = RefusalReward(by_hand, weight=0.5, verifier="answerable")
    by_hand = JudgedAnswerReward(by_hand, judge_by_length, weight=0.5)
    by_hand = TextActions(by_hand, tags="all")
    made = rag_gym.make(
        "rag_gym/SynthHop-v0",
        reward_preset="eval_rar",
        text_actions="all",
        extra_terms=[
            functools.partial(StepCost, weight=0.1),
            functools.partial(RefusalReward, weight=0.5, verifier="answerable"),
            functools.partial(JudgedAnswerReward, judge=judge_by_length, weight=0.5),
        ],
        **KW,
    )
    assert chain(made) == chain(by_hand)
    assert made.spec.additional_wrappers == by_hand.spec.additional_wrappers
    for index, turns in ((0, EVAL_RAR_TURNS), (1, ["<refuse/>"]), (2, ["<answer>x</answer>"])):
        assert play(made, turns, index) == play(by_hand, turns, index)


def test_a_text_in_preset_brings_its_text_actions_and_extra_terms_go_outside_it():
    by_hand = TextActions(DropBaseReward(gym.make("rag_gym/SynthHop-v0", **KW)), "when_to_search")
    by_hand = LWTSSearchReward(LWTSFormatReward(by_hand), encoder=stub_encoder)
    by_hand = StepCost(MultiStageAnswerReward(by_hand, stage=2), weight=0.05)
    for text_actions in (None, True, "when_to_search"):
        made = rag_gym.make(
            "rag_gym/SynthHop-v0",
            reward_preset="when_to_search",
            reward_kwargs={"encoder": stub_encoder, "stage": 2},
            text_actions=text_actions,
            extra_terms=[functools.partial(StepCost, weight=0.05)],
            **KW,
        )
        assert chain(made) == chain(by_hand)
        turns = ["<think>a</think><search>{q}</search>", "<reflect>b</reflect><answer>{a}</answer>"]
        assert play(made, turns, 4) == play(by_hand, turns, 4)
    with pytest.raises(ValueError, match=r"expected tags 'when_to_search'.*got 'search_r1'"):
        rag_gym.make(
            "rag_gym/SynthHop-v0", reward_preset="when_to_search", text_actions="search_r1", **KW
        )


def test_text_actions_true_plays_the_presets_tags_and_leaves_a_text_env_as_it_is():
    env = rag_gym.make("rag_gym/SynthHop-v0", reward_preset="eval_rar", text_actions=True, **KW)
    assert isinstance(env, TextActions) and env.tags.name == "eval_rar"
    assert rag_gym.make("rag_gym/SynthHop-v0", text_actions=True, **KW).tags.name == "search_r1"
    reader = rag_gym.make("rag_gym/SynthHop-Reader-v0", text_actions=True, **KW)
    assert "TextActions" not in chain(reader)
    with pytest.raises(
        ValueError, match=r"expected tags None, what this ReaderEnv reads as built.*got 'eval_rar'"
    ):
        rag_gym.make("rag_gym/SynthHop-Reader-v0", text_actions="eval_rar", **KW)
    assert with_text_actions(env, "eval_rar") is env


def test_make_refuses_bad_text_actions_and_extra_terms():
    with pytest.raises(ValueError, match="did you mean 'search_r1'"):
        rag_gym.make("rag_gym/SynthHop-v0", text_actions="serch_r1", **KW)
    with pytest.raises(TypeError, match="expected a tag preset name"):
        rag_gym.make("rag_gym/SynthHop-v0", text_actions=3, **KW)
    with pytest.raises(TypeError, match="expected extra_terms to be callables env -> env, got"):
        rag_gym.make("rag_gym/SynthHop-v0", extra_terms=[0.1], **KW)
    # a term the preset has already: one record per name in info["reward_terms"]
    cost = functools.partial(StepCost, weight=0.05)
    with pytest.raises(ValueError, match=r"'step_cost' is already in the reward .*'evo_rag'"):
        rag_gym.make("rag_gym/SynthHop-v0", "evo_rag", extra_terms=[cost], **KW)
    with pytest.raises(ValueError, match="'step_cost' is already in the reward"):
        rag_gym.make("rag_gym/SynthHop-v0", extra_terms=[cost, cost], **KW)
    with pytest.raises(ValueError, match=r"'step_cost' is already in the reward \(StepCost"):
        StepCost(StepCost(gym.make("rag_gym/SynthHop-v0", **KW)))  # a stack built by hand too
    env = rag_gym.make("rag_gym/SynthHop-v0", "eval_rar", extra_terms=[cost], **KW)
    assert [w.name for w in env.spec.additional_wrappers][-1] == "StepCost"


def test_only_the_env_factory_constructs_text_actions():
    """``rag_gym.make`` (:mod:`rag_gym.wrappers.presets`) is the one place a stack is assembled;
    ``text_actions.py`` defines the class."""
    root = Path(rag_gym.__file__).parent
    found = [
        f"{path.relative_to(root)}:{number}"
        for path in sorted(root.rglob("*.py"))
        if path.relative_to(root).as_posix()
        not in ("wrappers/presets.py", "wrappers/text_actions.py")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\bTextActions\(", line)
    ]
    assert found == []

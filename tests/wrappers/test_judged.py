"""The LLM judge as a reward term: asked only about answers EM under-scores, cached, and wired
into the trainers' env factory."""

from __future__ import annotations

import gymnasium as gym
import pytest

import rag_gym  # noqa: F401
from rag_gym.envs import ActionType
from rag_gym.generation.judges import LLMAnswerJudge
from rag_gym.wrappers import JudgedAnswerReward
from tests.conftest import SMALL_WORLD, EchoLM


class Recorder:
    def __init__(self, verdict: bool) -> None:
        self.verdict = verdict
        self.asked: list[tuple] = []

    def __call__(self, question, prediction, golds):
        self.asked.append((question, prediction, tuple(golds)))
        return self.verdict


def _env(judge, **kwargs):
    env = gym.make("rag_gym/SynthHop-v0", split="validation", dataset_kwargs=SMALL_WORLD, **kwargs)
    return JudgedAnswerReward(env, judge)


def _answer(env, text):
    env.reset(seed=0, options={"question_index": 0})
    return env.step({"type": ActionType.ANSWER, "text": text})


def test_a_wrong_answer_the_judge_accepts_scores_one():
    judge = Recorder(True)
    env = _env(judge)
    _, reward, terminated, _, info = _answer(env, "a paraphrase of the answer")
    example = env.unwrapped.current_example
    assert terminated and reward == 1.0 and info["judge"] is True
    assert info["reward_terms"]["answer"] == 0.0 and info["reward_terms"]["judge"] == 1.0
    assert judge.asked == [(example.question, "a paraphrase of the answer", example.answers)]


def test_a_wrong_answer_the_judge_rejects_scores_zero_and_a_right_one_costs_no_call():
    judge = Recorder(False)
    env = _env(judge)
    _, reward, _, _, info = _answer(env, "wrong")
    assert reward == 0.0 and info["judge"] is False and len(judge.asked) == 1
    gold = env.unwrapped.current_example.answers[0]
    _, reward, _, _, info = _answer(env, gold)
    assert reward == 1.0 and "judge" not in info and len(judge.asked) == 1


def test_f1_answers_get_the_rest_of_the_way_and_searches_are_never_judged():
    judge = Recorder(True)
    env = _env(judge, answer_metric="f1")
    env.reset(seed=0, options={"question_index": 0})
    _, reward, _, _, info = env.step({"type": ActionType.SEARCH, "text": "anything"})
    assert info["reward_terms"]["judge"] == 0.0 and judge.asked == []
    gold = env.unwrapped.current_example.answers[0]
    _, reward, _, _, info = env.step({"type": ActionType.ANSWER, "text": f"{gold} and more words"})
    partial = info["reward_terms"]["answer"]
    assert 0.0 < partial < 1.0
    assert info["reward_terms"]["judge"] == pytest.approx(1.0 - partial)
    assert reward == pytest.approx(1.0)


def test_refusals_and_unanswerable_questions_are_not_judged():
    judge = Recorder(True)
    env = JudgedAnswerReward(gym.make("rag_gym/SynthHop-Hard-v0", split="validation"), judge)
    examples = env.unwrapped.examples
    unanswerable = next(i for i, ex in enumerate(examples) if not ex.answerable)
    env.reset(seed=0, options={"question_index": unanswerable})
    _, _, terminated, _, info = env.step({"type": ActionType.ANSWER, "text": "a guess"})
    assert terminated and "judge" not in info and judge.asked == []
    env.reset(seed=0, options={"question_index": 0})
    _, _, terminated, _, info = env.step({"type": ActionType.REFUSE, "text": ""})
    assert terminated and "judge" not in info and judge.asked == []


def test_the_answer_judge_caches_verdicts_on_normalised_answers_but_not_errors():
    lm = EchoLM("yes")
    judge = LLMAnswerJudge(lm)
    assert judge("Who?", "The Eiffel Tower", ["Eiffel tower"]) is True
    assert judge("Who?", "eiffel tower.", ["Eiffel Tower"]) is True  # the same after normalising
    assert judge("Who?", "Paris", ["Eiffel Tower"]) is True
    assert judge.stats() == {
        "calls": 2,
        "cache_hits": 1,
        "errors": 0,
        "seconds": judge.stats()["seconds"],
    }
    assert len(lm.calls) == 2
    failing = LLMAnswerJudge(EchoLM(fail=True))
    assert failing("Who?", "x", ["y"]) is False and failing("Who?", "x", ["y"]) is False
    assert failing.calls == 2 and failing.errors == 2 and failing.cache_hits == 0
    uncached = LLMAnswerJudge(EchoLM("no"), cache=False)
    uncached("Q", "a", ["b"])
    uncached("Q", "a", ["b"])
    assert uncached.calls == 2


def test_the_trainers_env_factory_adds_one_shared_judge(monkeypatch):
    from rag_gym.generation import backends
    from rag_gym.train.episodes import env_factory

    built = []

    def fake_make_lm(spec, seed=0):
        built.append(spec)
        return EchoLM("yes")

    monkeypatch.setattr(backends, "make_lm", fake_make_lm)
    make = env_factory(
        "rag_gym/SynthHop-v0", split="validation", judge="llama_cpp", dataset_kwargs=SMALL_WORLD
    )
    envs = [make(), make()]
    judges = []
    for env in envs:
        inner = env
        while not isinstance(inner, JudgedAnswerReward):
            inner = inner.env
        judges.append(inner.judge)
    assert built == ["llama_cpp"] and judges[0] is judges[1]
    env = envs[0]
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step("<answer>not the answer</answer>")
    assert terminated and reward == 1.0 and info["judge"] is True
    with pytest.raises(ValueError, match="backend spec"):
        env_factory("rag_gym/SynthHop-v0", judge="")

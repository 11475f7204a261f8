"""Naive RAG (with a fake and with the embedded model) and the random agent."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import rag_gym  # noqa: F401
from rag_gym.baselines import make_agent
from rag_gym.baselines.naive_rag import NaiveRAG, clean_answer
from rag_gym.baselines.random import RandomAgent
from rag_gym.envs import ActionType
from rag_gym.generation.lm import GenerationConfig
from tests.conftest import SMALL_WORLD, EchoLM, requires_llama


def small_env():
    return gym.make("rag_gym/SynthHop-v0", split="validation", dataset_kwargs=SMALL_WORLD)


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("Answer: Velmora.", "Velmora"),
        ('"Velmora"\nIt is a city.', "Velmora"),
        ("\n\n  1962  ", "1962"),
        ("Final answer: Ada Vell", "Ada Vell"),
        ("", ""),
    ],
)
def test_clean_answer(raw, clean):
    assert clean_answer(raw) == clean


def test_naive_rag_searches_once_then_answers_from_passages():
    env = small_env()
    lm = EchoLM(reply="Answer: Velmora.")
    agent = NaiveRAG(lm)
    obs, info = env.reset(seed=3)
    agent.reset()
    action = agent.act(obs, info)
    assert action == {"type": ActionType.SEARCH, "text": info["question"]}
    obs, _, _, _, info = env.step(action)
    action = agent.act(obs, info)
    assert action == {"type": ActionType.ANSWER, "text": "Velmora"}
    # the LM saw the question and the retrieved passages
    prompt = lm.calls[-1][0]
    assert prompt[0]["role"] == "system" and info["question"] in prompt[1]["content"]
    first_title = env.unwrapped.corpus[info["retrieved_ids"][0]].title
    assert first_title in prompt[1]["content"]
    assert agent.usage == {"prompt_tokens": 10, "completion_tokens": 2, "bad_replies": 0}
    _, _, terminated, _, _ = env.step(action)
    assert terminated


def test_naive_rag_batches_generation():
    env = small_env()
    lm = EchoLM(reply="x")
    agent = NaiveRAG(lm)
    observations, infos = [], []
    for seed in range(4):
        obs, info = env.reset(seed=seed)
        obs, _, _, _, info = env.step({"type": ActionType.SEARCH, "text": info["question"]})
        observations.append(obs)
        infos.append(info)
    actions = agent.act_batch(observations, infos, list(range(4)))
    assert len(lm.calls) == 1 and len(lm.calls[0]) == 4
    assert all(a["type"] == ActionType.ANSWER for a in actions)


def test_naive_rag_empty_reply_answers_unknown():
    agent = NaiveRAG(EchoLM(reply="   "))
    info = {"num_searches": 1, "question": "q", "passages": []}
    assert agent.act("Question: q", info)["text"] == "unknown"


def test_random_agent_is_seeded_and_respects_the_mask():
    env = small_env()

    def play(seed):
        agent = RandomAgent(seed=0)
        obs, info = env.reset(seed=seed)
        agent.reset(seed)
        actions = []
        done = False
        while not done:
            action = agent.act(obs, info)
            assert info["action_mask"][action["type"]] == 1
            actions.append((int(action["type"]), action["text"]))
            obs, _, term, trunc, info = env.step(action)
            done = term or trunc
        return actions

    assert play(5) == play(5)
    assert len({tuple(play(s)) for s in range(6)}) > 1


def test_make_agent_errors():
    with pytest.raises(ValueError, match="did you mean 'naive_rag'"):
        make_agent("naive_rg")
    with pytest.raises(ValueError, match="needs a language model"):
        make_agent("naive_rag")
    assert isinstance(make_agent("random", seed=1), RandomAgent)


def test_generation_config_errors():
    with pytest.raises(ValueError, match="expected max_tokens >= 1"):
        GenerationConfig(max_tokens=0)
    with pytest.raises(ValueError, match="expected temperature >= 0"):
        GenerationConfig(temperature=-1)


@pytest.mark.llm
@requires_llama
def test_embedded_smollm2_generates():
    from rag_gym.generation.llama_cpp import LlamaCppLM

    lm = LlamaCppLM()
    (gens,) = lm.generate(
        [[{"role": "user", "content": "Name a colour."}]], GenerationConfig(max_tokens=8)
    )
    assert gens[0].text.strip() and gens[0].prompt_tokens > 0 and 0 < gens[0].completion_tokens <= 8
    again = lm.generate(
        [[{"role": "user", "content": "Name a colour."}]], GenerationConfig(max_tokens=8)
    )
    assert again[0][0].text == gens[0].text  # greedy is deterministic
    with pytest.raises(TypeError, match="got a single str"):
        lm.generate("hello")


@pytest.mark.llm
@requires_llama
@pytest.mark.slow
def test_naive_rag_with_embedded_model_end_to_end():
    from rag_gym.generation.llama_cpp import LlamaCppLM

    env = small_env()
    agent = NaiveRAG(LlamaCppLM())
    for seed in range(3):
        obs, info = env.reset(seed=seed)
        agent.reset()
        done, steps = False, 0
        while not done:
            obs, _, term, trunc, info = env.step(agent.act(obs, info))
            done, steps = term or trunc, steps + 1
        assert term and steps == 2 and info["action_type"] == "ANSWER" and info["prediction"]
        assert agent.usage["completion_tokens"] > 0
    np.testing.assert_array_equal(info["action_mask"], [1, 1, 1, 1, 1])

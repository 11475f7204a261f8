"""The vLLM backend against a stand-in for vllm (no GPU here): what it asks of vLLM and what it
returns, on its own and as a trainer's rollout generator."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from rag_gym.generation.lm import GenerationConfig


class FakeLLM:
    """``vllm.LLM.generate`` of token-id prompts: every reply is tokens 7, 8."""

    def __init__(self) -> None:
        self.calls: list[tuple[list, list]] = []

    def generate(self, prompts, params, use_tqdm=True):
        self.calls.append((prompts, params))
        reply = SimpleNamespace(token_ids=(7, 8), text="", finish_reason="length")
        return [SimpleNamespace(prompt_token_ids=None, outputs=[reply]) for _ in prompts]


@pytest.fixture
def llm(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace(SamplingParams=lambda **kw: kw))
    return FakeLLM()


def test_generate_ids_sends_token_ids_with_a_seed_per_prompt(llm):
    from rag_gym.generation.vllm_lm import VLLMLM

    lm = VLLMLM.from_llm(llm)
    config = GenerationConfig(max_tokens=5, temperature=0.7, stop=("</search>",), n=3, seed=10)
    assert lm.generate_ids([[1, 2], [3]], config) == [([7, 8], "length")] * 2
    [(prompts, params)] = llm.calls
    assert prompts == [{"prompt_token_ids": [1, 2]}, {"prompt_token_ids": [3]}]
    # copies of one prompt (a GRPO group) must not share a seed: they would sample alike
    assert [p["seed"] for p in params] == [10, 11]
    assert all(p["include_stop_str_in_output"] and p["n"] == 1 for p in params)
    assert all(p["stop"] == ["</search>"] and p["max_tokens"] == 5 for p in params)
    assert lm.describe() == {"backend": "vllm", "model": "vllm"}


def test_a_rollout_sampler_on_vllm_plays_turn_by_turn(llm):
    torch = pytest.importorskip("torch")
    from rag_gym.generation.vllm_lm import VLLMLM
    from rag_gym.train.rollout import Sampler

    generate = Sampler(VLLMLM.from_llm(llm), temperature=0.6, top_p=0.9)
    assert not generate.concurrent_clients and generate.model is None
    torch.manual_seed(0)
    with generate.session():
        assert generate([[1], [2]], 4, ["</answer>"]) == [[7, 8], [7, 8]]
    [(_, params)] = llm.calls
    assert [(p["temperature"], p["top_p"], p["max_tokens"]) for p in params] == [(0.6, 0.9, 4)] * 2
    assert params[1]["seed"] == params[0]["seed"] + 1

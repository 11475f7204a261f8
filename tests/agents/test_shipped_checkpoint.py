"""The shipped SynthHop agent loads and answers fixed test questions as its model card says."""

from __future__ import annotations

import importlib.util
import json

import gymnasium as gym
import pytest

import rag_gym  # noqa: F401
from rag_gym.agents.search_r1 import checkpoint_path
from tests.conftest import requires_llama

CARD = json.loads((checkpoint_path("synthhop") / "rag_gym.json").read_text())


def play(agent, env, index):
    obs, info = env.reset(options={"index": index})
    agent.reset(slot=0)
    while True:
        obs, _, term, trunc, info = env.step(agent.act(obs, info))
        if term or trunc:
            return info


def test_card_and_files():
    folder = checkpoint_path("synthhop")
    assert CARD["base"] == "embedded" and CARD["fixed_questions"]
    for name in ("adapter.gguf", "adapter_model.safetensors", "adapter_config.json", "README.md"):
        assert (folder / name).is_file()
    size = sum(p.stat().st_size for p in folder.iterdir())
    assert size <= 20 * 2**20  # the whole checkpoint ships in at most 20 MB


@pytest.mark.llm
@requires_llama
def test_shipped_agent_answers_the_card_s_fixed_questions():
    from rag_gym.baselines import make_agent
    from rag_gym.generation.llama_cpp import LlamaCppLM
    from rag_gym.wrappers import TextActions

    agent = make_agent("search_r1:synthhop", lm=LlamaCppLM(n_threads=1))
    env = TextActions(gym.make(CARD["env_id"], split="test"), tags=CARD["tags"])
    fixed = CARD["fixed_questions"]
    same, em = 0, 0.0
    for q in fixed:
        info = play(agent, env, q["index"])
        assert info["question"] == q["question"]
        same += info.get("prediction") == q["prediction"]
        em += (info.get("scores") or {}).get("em", 0.0)
    # greedy llama.cpp output can differ in the last bits between CPUs: allow one question
    assert same >= len(fixed) - 1
    assert abs(em / len(fixed) - CARD["fixed_questions_em"]) <= 1 / len(fixed) + 1e-9


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


@pytest.mark.llm
@requires_llama
def test_record_fixed_questions_writes_what_the_checkpoint_answers(tmp_path):
    import shutil

    from rag_gym.train.ship import record_fixed_questions

    copy = tmp_path / "checkpoint"
    shutil.copytree(checkpoint_path("synthhop"), copy)
    meta = record_fixed_questions(copy, indices=[4, 7])
    assert [q["index"] for q in meta["fixed_questions"]] == [4, 7]
    shipped = {q["index"]: q for q in CARD["fixed_questions"]}
    for q in meta["fixed_questions"]:
        assert q["question"] == shipped[q["index"]]["question"]
    # at most one of two greedy answers may differ between CPUs (see the test above)
    same = sum(
        q["prediction"] == shipped[q["index"]]["prediction"] for q in meta["fixed_questions"]
    )
    assert same >= 1
    assert meta["fixed_questions_em"] == sum(q["em"] for q in meta["fixed_questions"]) / 2
    saved = json.loads((copy / "rag_gym.json").read_text())
    assert saved["fixed_questions"] == meta["fixed_questions"]
    assert "| 7 | In which country is the birthplace of" in (copy / "README.md").read_text()

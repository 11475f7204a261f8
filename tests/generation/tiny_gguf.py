"""Tiny random transformers models of each architecture rag-gym ships adapters for, written as
llama.cpp GGUF base models, for the adapter round-trip test.

The GGUF is written as llama.cpp's ``convert_hf_to_gguf.py`` writes these architectures: tensor
names from the ``gguf`` package's name map, Q and K rows permuted for the ``llama``
architecture only, Gemma 3's RMSNorm weights stored as ``1 + w``, the tied output head left
out, float32 throughout. The vocabulary is a 512-token SentencePiece-style list (``<unk>``,
``<s>``, ``</s>``, 256 byte tokens, pieces); the tests feed token ids, never text. That the
file is right is checked, not assumed: its logits must equal transformers' forward.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

VOCAB = 512
LAYERS = {"gemma3": 6}  # Gemma 3: five sliding layers, then a global one, as llama.cpp builds it
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=2,
    rms_norm_eps=1e-6,
    initializer_range=0.1,  # logits spread well beyond rounding, so greedy picks are not ties
    tie_word_embeddings=True,
)
#: architecture → (transformers config class name, extra config fields, llama.cpp architecture)
ARCHITECTURES: dict[str, tuple[str, dict[str, Any], str]] = {
    "llama": ("LlamaConfig", {}, "llama"),
    "mistral": ("MistralConfig", {"sliding_window": None}, "llama"),
    "qwen2": ("Qwen2Config", {}, "qwen2"),
    "qwen3": ("Qwen3Config", {"head_dim": 16}, "qwen3"),
    "gemma3": (
        "Gemma3TextConfig",
        {"head_dim": 16, "query_pre_attn_scalar": 16, "sliding_window": 256},
        "gemma3",
    ),
}


def tiny_model(arch: str, seed: int = 0, **overrides: Any) -> Any:
    """A random float32 causal LM of ``arch`` (a key of :data:`ARCHITECTURES`), with config
    fields ``overrides`` (``sliding_window=16``)."""
    import torch
    import transformers

    cls, extra, _ = ARCHITECTURES[arch]
    config = getattr(transformers, cls)(
        **{**COMMON, "num_hidden_layers": LAYERS.get(arch, 2), **extra, **overrides}
    )
    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def _rope_theta(config: Any) -> float:
    params = getattr(config, "rope_parameters", None) or {}
    if "full_attention" in params:  # per layer type (Gemma 3): the global layers'
        params = params["full_attention"]
    return float(params.get("rope_theta", getattr(config, "rope_theta", 10000.0)))


def write_gguf(model: Any, path: str | Path, arch: str) -> Path:
    """``model`` (from :func:`tiny_model`) as a float32 llama.cpp base GGUF at ``path``."""
    import gguf

    cfg = model.config
    gguf_arch = ARCHITECTURES[arch][2]
    model_arch = next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == gguf_arch)
    n_layer = cfg.num_hidden_layers
    names = gguf.get_tensor_name_map(model_arch, n_layer)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    w = gguf.GGUFWriter(str(path), gguf_arch)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(_rope_theta(cfg))
    if gguf_arch == "gemma3":
        w.add_sliding_window(cfg.sliding_window)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    tokens = [b"<unk>", b"<s>", b"</s>"] + [f"<0x{i:02X}>".encode() for i in range(256)]
    tokens += [f"\u2581p{i}".encode() for i in range(VOCAB - len(tokens))]
    kinds = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    kinds += [gguf.TokenType.BYTE] * 256 + [gguf.TokenType.NORMAL] * (VOCAB - 259)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * VOCAB)
    w.add_token_types(kinds)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    for key, tensor in model.state_dict().items():
        if key == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        name = names.get_name(key, try_suffixes=(".weight", ".bias"))
        assert name is not None, f"gguf has no name for {key}"
        data = tensor.detach().float().numpy().copy()
        if gguf_arch == "llama" and key.endswith("q_proj.weight"):
            data = _permute(data, cfg.num_attention_heads)
        elif gguf_arch == "llama" and key.endswith("k_proj.weight"):
            data = _permute(data, cfg.num_key_value_heads)
        if gguf_arch == "gemma3" and key.endswith("norm.weight"):
            data = data + 1  # Gemma's RMSNorm scales by 1 + w; llama.cpp's by w
        w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)


def f32_copy(src: str | Path, dst: str | Path) -> Path:
    """The GGUF model ``src`` with every tensor dequantised to float32 (its metadata kept, the
    file type set to all-F32), written to ``dst``: the weights transformers trains on after
    dequantising ``src``, for llama.cpp to run without quantised matmuls."""
    import gguf

    reader = gguf.GGUFReader(str(src))
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(str(dst), arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", "general.file_type"):
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), kind, sub_type=sub)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    for tensor in reader.tensors:
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        shape = tuple(int(n) for n in reversed(tensor.shape))
        writer.add_tensor(
            tensor.name, np.ascontiguousarray(values, dtype=np.float32).reshape(shape)
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(dst)

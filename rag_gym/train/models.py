"""Policies to train: the embedded SmolLM2-135M made trainable, any hub id or directory, or a
tiny randomly initialised model for smoke tests.

transformers loads the embedded ``SmolLM2-135M-Instruct.Q4_1.gguf`` by dequantising it to
float32, but marks the model as quantised (``hf_quantizer``, ``is_quantized``,
``quantization_config``), and ``Trainer`` refuses to train a quantised model without adapters.
:func:`trainable_embedded` clears the markers once and saves a plain checkpoint to a cache
folder, which every later run loads directly.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

EMBEDDED = "embedded"
CACHE_ENV = "RAG_GYM_CACHE"


def _require():
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise ImportError(
            "training needs torch, transformers, trl and peft: pip install torch==2.13.0 "
            "&& pip install 'rag-gym[train]'"
        ) from exc
    return torch, transformers


def cache_dir() -> Path:
    """Where converted models live: ``$RAG_GYM_CACHE`` or ``~/.cache/rag_gym``."""
    return Path(os.environ.get(CACHE_ENV, Path.home() / ".cache" / "rag_gym"))


def trainable_embedded(out: str | Path | None = None) -> Path:
    """A plain (float32, unquantised) checkpoint of the embedded SmolLM2-135M-Instruct.

    Converted from the GGUF on first use (about 10 s), then reused. Returns its directory.
    """
    from rag_gym.generation.llama_cpp import embedded_gguf_path

    torch, transformers = _require()
    from rag_gym.generation.transformers_lm import EMBEDDED_DIR_NAME

    out = Path(out) if out is not None else cache_dir() / EMBEDDED_DIR_NAME
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        return out
    gguf = embedded_gguf_path()
    tok = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    try:
        tmp.replace(out)
    except OSError:  # another process converted it first
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return out


def load_policy(
    model: str | Path | None = EMBEDDED, dtype: str | None = None, device: str | None = None
) -> tuple[Any, Any]:
    """``(model, tokenizer)`` ready to train.

    Args:
        model: ``"embedded"`` (SmolLM2-135M-Instruct, offline), ``"tiny"`` (a 2-layer random
            Llama with SmolLM2's tokenizer, for smoke tests), a hub id or a local directory.
        dtype: a torch dtype name; default float32 on CPU, bfloat16 on GPU.
        device: default CUDA when available.
    """
    torch, transformers = _require()
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = dtype or ("float32" if device == "cpu" else "bfloat16")
    if not isinstance(dtype, str) or not isinstance(getattr(torch, dtype, None), torch.dtype):
        raise ValueError(f"expected a torch dtype name such as 'float32', got {dtype!r}")
    if model is None or model == EMBEDDED:
        source: str | Path = trainable_embedded()
    elif model == "tiny":
        return tiny_policy(device=device)
    else:
        source = model
    tok = transformers.AutoTokenizer.from_pretrained(source)
    net = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=getattr(torch, dtype))
    _prepare_tokenizer(tok)
    return net.to(device), tok


def tiny_policy(device: str = "cpu", seed: int = 0, hidden_size: int = 64) -> tuple[Any, Any]:
    """A 2-layer, ``hidden_size``-wide (64) random Llama with the embedded SmolLM2 tokenizer
    (and chat template): enough to check that a trainer runs and updates weights, in seconds."""
    torch, transformers = _require()
    tok = transformers.AutoTokenizer.from_pretrained(trainable_embedded())
    _prepare_tokenizer(tok)
    config = transformers.LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(config).to(device), tok


def _prepare_tokenizer(tok: Any) -> None:
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"


def lora_config(r: int, alpha: int) -> Any:
    """PEFT's LoRA config for a policy: rank ``r`` and ``alpha`` on every linear layer but the
    output head (PEFT's ``all-linear``; SmolLM2 ties the head to the embeddings, and llama.cpp
    cannot apply adapters on either)."""
    from peft import LoraConfig

    return LoraConfig(r=r, lora_alpha=alpha, target_modules="all-linear", task_type="CAUSAL_LM")

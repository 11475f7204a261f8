"""Policies to train: the embedded SmolLM2-135M made trainable, a GGUF file, any hub id or
directory, or a tiny randomly initialised model for smoke tests.

transformers loads a GGUF file (the embedded ``SmolLM2-135M-Instruct.Q4_1.gguf``, or a user's own
such as Gemma 3 270M) by dequantising it to float32, but marks the model as quantised
(``hf_quantizer``, ``is_quantized``, ``quantization_config``), and ``Trainer`` refuses to train a
quantised model without adapters. :func:`trainable_gguf` clears the markers once and saves a
plain checkpoint to a cache folder named after the file's content, which every later run loads
directly. A LoRA trained on it ships back to llama.cpp on the same GGUF
(:mod:`rag_gym.generation.adapters`).

A model without a chat template (a base model) is refused unless one is named
(``chat_template=``, ``--chat-template``; :mod:`rag_gym.generation.chat_templates`): the
transcripts are rendered with it, and the run records it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rag_gym._text import shown
from rag_gym.generation.lm import cache_dir

EMBEDDED = "embedded"


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


def trainable_embedded(out: str | Path | None = None) -> Path:
    """A plain (float32, unquantised) checkpoint of the embedded SmolLM2-135M-Instruct.

    Converted from the GGUF on first use (about 10 s), then reused. Returns its directory.
    """
    from rag_gym.generation.llama_cpp import embedded_gguf_path
    from rag_gym.generation.transformers_lm import EMBEDDED_DIR_NAME

    out = Path(out) if out is not None else cache_dir() / EMBEDDED_DIR_NAME
    return trainable_gguf(embedded_gguf_path(), out)


def _digest(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def trainable_gguf(path: str | Path, out: str | Path | None = None) -> Path:
    """A plain (float32, unquantised) transformers checkpoint of the GGUF model file ``path``.

    Dequantised on first use (10 s for SmolLM2-135M, about a minute for Gemma 3 270M), then
    reused: the default folder is ``cache_dir()/gguf/<file stem>-<first 12 hex digits of the
    file's SHA-256>``, so an edited file gets a new copy. Returns its directory. ``ValueError``
    for a file transformers cannot read as a GGUF model (naming the file and why).
    """
    torch, transformers = _require()
    from rag_gym.generation.transformers_lm import as_llama_cpp_runs_it

    gguf = Path(path).expanduser()
    if not gguf.is_file():
        raise FileNotFoundError(f"no GGUF model file at {gguf}")
    if out is None:
        out = cache_dir() / "gguf" / f"{gguf.stem}-{_digest(gguf)[:12]}"
    out = Path(out)
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        return out
    try:
        import gguf as _gguf  # noqa: F401
    except ImportError as exc:
        raise ImportError("training on a GGUF file needs gguf: pip install 'rag-gym[hf]'") from exc
    try:
        tok = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32
        )
    except ImportError:
        raise
    except Exception as exc:  # the GGUF reader's errors: struct.error, KeyError, ValueError...
        raise ValueError(
            f"{gguf}: transformers cannot load this GGUF as a causal LM ({shown(exc)}); pass a "
            "GGUF of an architecture transformers reads (llama, mistral, qwen2, qwen3, gemma3, "
            "...), a model folder or a hub id"
        ) from exc
    tok = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    as_llama_cpp_runs_it(model.config)
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    out.parent.mkdir(parents=True, exist_ok=True)
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
    model: str | Path | None = EMBEDDED,
    dtype: str | None = None,
    device: str | None = None,
    chat_template: str | Path | None = None,
) -> tuple[Any, Any]:
    """``(model, tokenizer)`` ready to train.

    Args:
        model: what ``--lm`` takes: ``"embedded"`` (SmolLM2-135M-Instruct, offline), a ``.gguf``
            model file (dequantised once, :func:`trainable_gguf`), a hub id or a local model
            directory; or ``"tiny"`` (a 2-layer random Llama with SmolLM2's tokenizer, for
            smoke tests).
        dtype: a torch dtype name; default float32 on CPU, bfloat16 on GPU.
        device: default CUDA when available.
        chat_template: the chat template the transcripts are rendered with (``chatml``,
            ``gemma``, ``llama3`` or a Jinja file; :mod:`rag_gym.generation.chat_templates`);
            ``None`` is the model's own, and a model without one is refused
            (:class:`~rag_gym.generation.chat_templates.MissingChatTemplate`). It is set on the
            tokenizer (so it is saved with the adapter), and :func:`policy_template` gives its
            record.
    """
    torch, transformers = _require()
    from rag_gym.generation import chat_templates

    named = chat_templates.chat_template(chat_template)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = dtype or ("float32" if device == "cpu" else "bfloat16")
    if not isinstance(dtype, str) or not isinstance(getattr(torch, dtype, None), torch.dtype):
        raise ValueError(f"expected a torch dtype name such as 'float32', got {dtype!r}")
    if model == "tiny":
        net, tok = tiny_policy(device=device)
    else:
        source = policy_source(model)
        try:
            tok = transformers.AutoTokenizer.from_pretrained(source)
            net = transformers.AutoModelForCausalLM.from_pretrained(
                source, dtype=getattr(torch, dtype)
            )
        except OSError as exc:
            raise ValueError(
                f"cannot load the model {str(model)!r} ({shown(exc)}); pass 'embedded', a .gguf "
                "file, a model folder (with config.json) or a hub id this machine can reach"
            ) from exc
        _prepare_tokenizer(tok)
        net = net.to(device)
    own = chat_templates.own_template(getattr(tok, "chat_template", None))
    template = chat_templates.decide(named, own, str(model))
    if named is not None:
        tok.chat_template = named.source
    tok.rag_gym_chat_template = template.describe()
    return net, tok


def policy_template(tokenizer: Any) -> dict[str, str] | None:
    """The record (:meth:`~rag_gym.generation.chat_templates.ChatTemplate.describe`) of the
    template a policy's tokenizer renders its transcripts with: the named one when
    :func:`load_policy` was given one, else the tokenizer's own; ``None`` when it has none."""
    from rag_gym.generation.chat_templates import tokenizer_template

    record = getattr(tokenizer, "rag_gym_chat_template", None)
    return record if isinstance(record, dict) else tokenizer_template(tokenizer)


def policy_source(model: str | Path | None) -> str | Path:
    """What transformers loads for the ``model`` option: the trainable copy of a GGUF file
    (the embedded one for ``"embedded"``), else the hub id or folder itself. ``ValueError``
    for a path that is neither a folder nor a ``.gguf`` file (naming what was expected)."""
    if model is None or model == EMBEDDED:
        return trainable_embedded()
    if not isinstance(model, (str, Path)) or not str(model).strip():
        raise ValueError(
            f"expected model to be 'embedded', a .gguf file, a model folder or a hub id, got "
            f"{model!r}"
        )
    path = Path(model).expanduser()
    if path.suffix.lower() == ".gguf":
        if not path.is_file():
            raise FileNotFoundError(f"no GGUF model file at {path}")
        return trainable_gguf(path)
    if path.is_file():
        raise ValueError(
            f"expected model to be 'embedded', a .gguf file, a model folder or a hub id, got the "
            f"file {path}: pass its folder (with config.json), or a .gguf model file"
        )
    if path.is_dir() and not (path / "config.json").is_file():
        raise ValueError(
            f"expected a model folder with config.json, got {path} without one: pass the folder "
            "transformers saved (save_pretrained), a .gguf file or a hub id"
        )
    return str(model)


def model_option(model: Any) -> Any:
    """The ``model`` option as a run records it: a local file or folder as its absolute path
    (so that the run's checkpoints name the base they were trained on from any folder), else
    as given."""
    if isinstance(model, (str, Path)) and str(model) not in (EMBEDDED, "tiny"):
        path = Path(model).expanduser()
        if path.exists():
            return str(path.resolve())
    return model


def base_gguf(model: str | Path | None) -> Path | None:
    """The llama.cpp model a policy trained on ``model`` ships onto: the embedded GGUF for
    ``"embedded"``, the file itself for a ``.gguf``; ``None`` for a hub id or folder (convert
    it to GGUF with llama.cpp's ``convert_hf_to_gguf.py`` first)."""
    from rag_gym.generation.llama_cpp import embedded_gguf_path

    if model is None or model == EMBEDDED:
        return embedded_gguf_path()
    path = Path(str(model)).expanduser()
    return path.resolve() if path.suffix.lower() == ".gguf" and path.is_file() else None


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

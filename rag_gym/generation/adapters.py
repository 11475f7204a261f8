"""LoRA adapters for the llama.cpp backend: PEFT ``adapter_model.safetensors`` → GGUF adapter,
and the check that an adapter fits its base model.

llama.cpp applies a LoRA adapter stored as GGUF (``general.type = adapter``) on top of the base
GGUF at load time, so a policy trained here runs on the embedded Q4_1 SmolLM2 without torch and
without re-quantising merged weights (which loses a LoRA's effect at Q4_1). The conversion
(:func:`lora_to_gguf`) needs ``gguf``, ``safetensors`` and ``numpy`` only:

* tensors are renamed to llama.cpp's names, ``blk.N.{attn_q,attn_k,attn_v,attn_output,ffn_gate,
  ffn_up,ffn_down}.weight.lora_{a,b}``;
* ``lora_B`` of ``q_proj`` and ``k_proj`` gets llama.cpp's row permutation of the rotary halves
  (the base GGUF's Q and K weights were permuted the same way when it was converted);
* ``adapter.lora.alpha`` carries the PEFT ``lora_alpha``; llama.cpp scales by ``alpha / r``.

What a GGUF adapter cannot hold is refused with :class:`AdapterError`: adapters on the
embeddings or the output head (llama.cpp aborts on them), DoRA, rsLoRA, and per-module ranks or
alphas (llama.cpp applies one ``alpha / r`` to the whole adapter). llama.cpp also aborts the
whole process when an adapter's tensors do not fit the base model, so :func:`check_adapter_fits`
compares them first.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np


class AdapterError(ValueError):
    """An adapter that cannot be converted, or does not fit its base model."""


_MODULES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
_KEY = re.compile(
    r"layers\.(\d+)\.(self_attn\.[qkvo]_proj|mlp\.(?:gate|up|down)_proj)\.lora_([AB])\.weight$"
)


def _permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's Q/K row permutation (rotary halves interleaved per head)."""
    rows = weights.shape[0]
    if rows % (2 * n_head):
        raise AdapterError(
            f"expected a Q/K lora_B with rows a multiple of 2 x {n_head} heads, got {rows} rows: "
            "pass n_head and n_head_kv of the adapter's base model"
        )
    return (
        weights.reshape(n_head, 2, rows // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16}


def load_lora_tensors(path: str | Path) -> dict[str, np.ndarray]:
    """The tensors of a safetensors file as float32 numpy arrays, bfloat16 ones included.

    A LoRA trained on a GPU is saved in bfloat16, which numpy has no type for (``safetensors``'
    numpy loader raises ``TypeError: data type 'bfloat16' not understood``); a bfloat16 number is
    the upper half of a float32, so it is widened here without torch.
    """
    path = Path(path)
    raw = path.read_bytes()
    try:
        size = int.from_bytes(raw[:8], "little")
        header = json.loads(raw[8 : 8 + size])
    except (ValueError, UnicodeDecodeError) as exc:
        raise AdapterError(
            f"{path} is not a safetensors file ({exc}); save the adapter again"
        ) from exc
    data = memoryview(raw)[8 + size :]
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = _DTYPES.get(info.get("dtype"))
        if dtype is None:
            raise AdapterError(
                f"{path}: tensor {name!r} is {info.get('dtype')}, expected one of "
                f"{', '.join(_DTYPES)}; save the adapter in a floating-point type"
            )
        start, end = info["data_offsets"]
        values = np.frombuffer(data[start:end], dtype=dtype)
        if info["dtype"] == "BF16":
            values = (values.astype(np.uint32) << 16).view(np.float32)
        tensors[name] = values.astype(np.float32).reshape(info["shape"])
    return tensors


def read_adapter_config(adapter_dir: str | Path) -> dict:
    """``adapter_config.json`` of a PEFT adapter folder, checked for what llama.cpp can apply."""
    path = Path(adapter_dir) / "adapter_config.json"
    if not path.is_file():
        raise AdapterError(
            f"expected a PEFT LoRA adapter folder with adapter_config.json, got {adapter_dir} "
            "without one (save it with model.save_pretrained(dir) on a PEFT model)"
        )
    config = json.loads(path.read_text())
    if config.get("peft_type", "LORA") != "LORA":
        raise AdapterError(f"expected a LoRA adapter, got peft_type={config.get('peft_type')!r}")
    for key, why in (
        ("use_dora", "DoRA"),
        ("use_rslora", "rsLoRA"),
        ("rank_pattern", "per-module ranks"),
        ("alpha_pattern", "per-module alphas"),
    ):
        if config.get(key):
            raise AdapterError(
                f"{path}: {why} ({key}) cannot be shipped to llama.cpp, which applies one "
                "alpha/r to the whole adapter; train a plain LoRA"
            )
    targets = config.get("target_modules") or []
    targets = [targets] if isinstance(targets, str) else list(targets)
    saved = config.get("modules_to_save") or []
    bad = [m for m in [*targets, *saved] if any(k in m for k in ("lm_head", "embed_tokens"))]
    if bad:
        raise AdapterError(
            f"{path}: adapters on {bad} cannot be shipped to llama.cpp (SmolLM2 ties its "
            "embeddings and output head; llama.cpp aborts on them); target the linear layers only"
        )
    return config


def lora_to_gguf(
    adapter_dir: str | Path,
    out: str | Path | None = None,
    n_head: int | None = None,
    n_head_kv: int | None = None,
    architecture: str = "llama",
) -> Path:
    """Convert a PEFT LoRA adapter folder to a llama.cpp GGUF adapter (f16).

    Args:
        adapter_dir: folder with ``adapter_config.json`` and ``adapter_model.safetensors``.
        out: the ``.gguf`` file to write; default ``adapter_dir/adapter.gguf``.
        n_head, n_head_kv: attention heads of the base (for the Q/K permutation); default read
            from ``adapter_dir/config.json`` or, failing that, SmolLM2-135M's 9 and 3.
        architecture: the base GGUF's ``general.architecture``.

    Returns the written path.
    """
    import gguf

    adapter_dir = Path(adapter_dir)
    config = read_adapter_config(adapter_dir)
    weights_path = adapter_dir / "adapter_model.safetensors"
    if not weights_path.is_file():
        raise AdapterError(f"expected {weights_path}, got no such file")
    if n_head is None or n_head_kv is None:
        base = adapter_dir / "config.json"
        base_cfg = json.loads(base.read_text()) if base.is_file() else {}
        n_head = n_head or int(base_cfg.get("num_attention_heads", 9))
        n_head_kv = n_head_kv or int(base_cfg.get("num_key_value_heads", 3))
    tensors = load_lora_tensors(weights_path)
    out = Path(out) if out is not None else adapter_dir / "adapter.gguf"
    writer = gguf.GGUFWriter(str(out), architecture)
    writer.add_string("general.type", "adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", float(config.get("lora_alpha", config.get("r", 8))))
    names = []
    for key in sorted(tensors):
        m = _KEY.search(key)
        if m is None:
            raise AdapterError(
                f"{weights_path}: tensor {key!r} is not a LoRA weight of a llama linear layer "
                f"({', '.join(_MODULES)}); it cannot be shipped to llama.cpp"
            )
        layer, module, ab = int(m.group(1)), m.group(2), m.group(3)
        data = tensors[key].astype(np.float32)
        if ab == "B" and module == "self_attn.q_proj":
            data = _permute(data, n_head)
        elif ab == "B" and module == "self_attn.k_proj":
            data = _permute(data, n_head_kv)
        name = f"blk.{layer}.{_MODULES[module]}.weight.lora_{ab.lower()}"
        writer.add_tensor(name, data.astype(np.float16))
        names.append(name)
    if not names:
        raise AdapterError(f"{weights_path} holds no LoRA weights")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def resolve_adapter(path: str | Path) -> Path:
    """The LoRA adapter folder of ``path``: the folder itself (``adapter_config.json``), or a
    training run folder's ``final/``."""
    path = Path(path)
    for candidate in (path, path / "final"):
        if (candidate / "adapter_config.json").is_file():
            return candidate
    if not path.exists():
        raise FileNotFoundError(f"no adapter or run folder at {path}")
    raise AdapterError(
        f"expected a LoRA adapter folder (adapter_config.json) or a run folder with final/, got "
        f"{path}: train with LoRA (rag-gym train sft), or pass the adapter folder itself"
    )


def check_adapter_fits(adapter_gguf: str | Path, base_gguf: str | Path) -> None:
    """Raise :class:`AdapterError` unless every tensor of ``adapter_gguf`` applies to a weight of
    ``base_gguf`` with matching shape (llama.cpp itself aborts the process on a mismatch)."""
    import gguf

    adapter = gguf.GGUFReader(str(adapter_gguf))
    base = gguf.GGUFReader(str(base_gguf))
    kind = adapter.fields.get("general.type")
    if kind is None or bytes(kind.parts[-1]).decode() != "adapter":
        raise AdapterError(
            f"expected a GGUF LoRA adapter (general.type = adapter), got {adapter_gguf}; "
            "convert a PEFT adapter with lora_to_gguf (or ``rag-gym train export``)"
        )
    arch = lambda r: bytes(r.fields["general.architecture"].parts[-1]).decode()  # noqa: E731
    if arch(adapter) != arch(base):
        raise AdapterError(
            f"adapter {adapter_gguf} is for {arch(adapter)!r}, the base {base_gguf} is {arch(base)!r}"
        )
    shapes = {t.name: tuple(int(x) for x in t.shape) for t in base.tensors}
    for t in adapter.tensors:
        target = t.name.rsplit(".lora_", 1)[0]
        if target not in shapes:
            raise AdapterError(
                f"adapter {adapter_gguf} has {t.name} but the base {base_gguf} has no {target}: "
                "the adapter was trained on another model"
            )
        # GGUF shapes are (in, out) for a weight; lora_a is (in, r), lora_b is (r, out)
        in_dim, out_dim = shapes[target][0], shapes[target][1]
        dims = tuple(int(x) for x in t.shape)
        ok = dims[0] == in_dim if t.name.endswith("lora_a") else dims[1] == out_dim
        if not ok:
            raise AdapterError(
                f"adapter {adapter_gguf}: {t.name} has shape {dims}, which does not fit the base "
                f"weight {target} of shape {shapes[target]}: the adapter was trained on another model"
            )


def adapter_gguf(adapter: str | Path) -> Path:
    """The GGUF adapter file for ``adapter``: the file itself, or an adapter folder's
    ``adapter.gguf``, written from its PEFT weights when the folder has none yet."""
    path = Path(adapter)
    if path.suffix == ".gguf":
        if not path.is_file():
            raise FileNotFoundError(f"no GGUF adapter at {path}")
        return path
    folder = resolve_adapter(path)
    gguf_path = folder / "adapter.gguf"
    if not gguf_path.is_file():
        lora_to_gguf(folder, gguf_path)
    return gguf_path

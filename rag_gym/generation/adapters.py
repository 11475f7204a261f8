"""LoRA adapters for the llama.cpp backend: PEFT ``adapter_model.safetensors`` → GGUF adapter,
and the check that an adapter fits its base model.

llama.cpp applies a LoRA adapter stored as GGUF (``general.type = adapter``) on top of the base
GGUF at load time, so a policy trained here runs on its base GGUF (the embedded Q4_1 SmolLM2,
or a user's own such as Gemma 3 270M) without torch and without re-quantising merged weights
(which loses a LoRA's effect at Q4_1). The conversion (:func:`lora_to_gguf`) needs ``gguf``,
``safetensors`` and ``numpy`` only, and does what llama.cpp's own ``convert_lora_to_gguf.py``
does for the architectures of :data:`GGUF_ARCHITECTURES`:

* the base's llama.cpp architecture is read from the base GGUF's ``general.architecture``
  (or mapped from a transformers ``config.json``'s ``model_type``);
* tensors are renamed by the ``gguf`` package's own name map of that architecture
  (``gguf.get_tensor_name_map``): ``model.layers.N.self_attn.q_proj`` → ``blk.N.attn_q``, and so
  on, with ``.weight.lora_a`` / ``.weight.lora_b`` appended;
* only where llama.cpp's converter permutes the base's Q and K rows (the ``llama``
  architecture: Llama, SmolLM2, Mistral), ``lora_B`` of ``q_proj`` and ``k_proj`` gets the
  same row permutation of the rotary halves, with the base's head counts; Qwen2, Qwen3 and
  Gemma 3 keep their rows;
* ``adapter.lora.alpha`` carries the PEFT ``lora_alpha``; llama.cpp scales by ``alpha / r``.

What a GGUF adapter cannot hold is refused with :class:`AdapterError`: adapters on the
embeddings or the output head (llama.cpp aborts on them), DoRA, rsLoRA, per-module ranks or
alphas (llama.cpp applies one ``alpha / r`` to the whole adapter), a tensor the architecture's
name map does not know, and a base whose architecture is not in :data:`GGUF_ARCHITECTURES`.
llama.cpp also aborts the whole process when an adapter's tensors do not fit the base model, so
:func:`check_adapter_fits` compares them first.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from rag_gym.generation.lm import EMBEDDED_DIR_NAME


class AdapterError(ValueError):
    """An adapter that cannot be converted, or does not fit its base model."""


#: transformers ``model_type`` → the llama.cpp architecture (``general.architecture``) of its
#: GGUF, for the architectures whose adapters are tested end to end (tests/generation/
#: test_adapter_round_trip.py); llama.cpp's converter writes Mistral as ``llama``
GGUF_ARCHITECTURES: dict[str, str] = {
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "gemma3_text": "gemma3",
    "gemma3": "gemma3",
}
#: the llama.cpp architectures whose converter permutes the Q and K rows (``LlamaModel``)
PERMUTED = frozenset({"llama"})

_KEY = re.compile(
    r"^(?:base_model\.model\.)?(?P<module>.+)\.lora_(?P<ab>[AB])(?:\.default)?\.weight$"
)


def _permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's Q/K row permutation (rotary halves interleaved per head)."""
    rows = weights.shape[0]
    if rows % (2 * n_head):
        raise AdapterError(
            f"expected a Q/K lora_B with rows a multiple of 2 x {n_head} heads, got {rows} rows: "
            "the adapter was trained on another base model than the one named"
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


def _field(reader: Any, key: str) -> Any:
    """A scalar or string field of a GGUF file, ``None`` when absent."""
    field = reader.fields.get(key)
    if field is None:
        return None
    value = field.parts[-1]
    if field.types and field.types[0].name == "STRING":
        return bytes(value).decode("utf-8")
    return value[0].item() if len(value) else None


def base_shape(base: str | Path) -> dict[str, Any]:
    """What the conversion needs of a base model: ``{"architecture", "n_head", "n_head_kv",
    "n_layer"}``, read from a ``.gguf`` model file's metadata or from a transformers model
    folder's ``config.json`` (its ``model_type`` mapped by :data:`GGUF_ARCHITECTURES`).
    :class:`AdapterError` for anything else, or an architecture without a tested mapping."""
    path = Path(base).expanduser()
    if path.suffix.lower() == ".gguf":
        import gguf

        if not path.is_file():
            raise AdapterError(f"no base GGUF model at {path}")
        try:
            reader = gguf.GGUFReader(str(path))
        except Exception as exc:  # the reader's errors on a damaged file: ValueError, struct...
            raise AdapterError(f"{path} is not a readable GGUF model ({exc})") from None
        arch = _field(reader, "general.architecture")
        if _field(reader, "general.type") == "adapter":
            raise AdapterError(f"expected a base model GGUF, got the adapter {path}")
        shape = {
            "architecture": arch,
            "n_head": _field(reader, f"{arch}.attention.head_count"),
            "n_head_kv": _field(reader, f"{arch}.attention.head_count_kv"),
            "n_layer": _field(reader, f"{arch}.block_count"),
        }
        if arch not in set(GGUF_ARCHITECTURES.values()):
            raise AdapterError(
                f"{path} is a {arch!r} model; adapters ship to llama.cpp for the "
                f"architectures {sorted(set(GGUF_ARCHITECTURES.values()))} only"
            )
        shape["n_head_kv"] = shape["n_head_kv"] or shape["n_head"]
        return shape
    config_path = path / "config.json" if path.is_dir() else path
    if not config_path.is_file() or config_path.name != "config.json":
        raise AdapterError(
            f"expected the adapter's base model as a .gguf file or a model folder with "
            f"config.json, got {base}"
        )
    config = json.loads(config_path.read_text())
    config = config.get("text_config") or config  # a multimodal wrapper's language model
    model_type = config.get("model_type")
    if model_type not in GGUF_ARCHITECTURES:
        raise AdapterError(
            f"{config_path}: model_type {model_type!r} has no tested llama.cpp adapter "
            f"conversion; supported: {', '.join(GGUF_ARCHITECTURES)}"
        )
    n_head = int(config["num_attention_heads"])
    return {
        "architecture": GGUF_ARCHITECTURES[model_type],
        "n_head": n_head,
        "n_head_kv": int(config.get("num_key_value_heads") or n_head),
        "n_layer": int(config["num_hidden_layers"]),
    }


def adapter_base(adapter_dir: str | Path) -> Path | None:
    """The base model an adapter folder itself names, for :func:`lora_to_gguf`: ``rag_gym.json``'s
    ``base`` (``"embedded"``: the embedded GGUF; a ``.gguf`` file), else PEFT's
    ``base_model_name_or_path`` when it is a local GGUF or model folder (the trainers' dequantised
    copy of a GGUF); ``None`` when neither is here."""
    folder = Path(adapter_dir)
    names: list[Any] = []
    meta = folder / "rag_gym.json"
    if meta.is_file():
        names.append(json.loads(meta.read_text()).get("base"))
    config = folder / "adapter_config.json"
    if config.is_file():
        names.append(json.loads(config.read_text()).get("base_model_name_or_path"))
    for name in names:
        if not isinstance(name, str) or not name:
            continue
        if name == "embedded" or Path(name).name == EMBEDDED_DIR_NAME:
            from rag_gym.generation.lm import embedded_gguf_path

            return embedded_gguf_path()
        path = Path(name).expanduser()
        if (path.suffix.lower() == ".gguf" and path.is_file()) or (path / "config.json").is_file():
            return path
    return None


def lora_to_gguf(
    adapter_dir: str | Path,
    out: str | Path | None = None,
    base: str | Path | None = None,
    *,
    architecture: str | None = None,
    n_head: int | None = None,
    n_head_kv: int | None = None,
) -> Path:
    """Convert a PEFT LoRA adapter folder to a llama.cpp GGUF adapter (f16) for its base model.

    Args:
        adapter_dir: folder with ``adapter_config.json`` and ``adapter_model.safetensors``.
        out: the ``.gguf`` file to write; default ``adapter_dir/adapter.gguf``.
        base: the base model the adapter goes on: its ``.gguf`` file (the truth llama.cpp
            loads) or a transformers model folder; default the one the folder names
            (:func:`adapter_base`).
        architecture, n_head, n_head_kv: the base's llama.cpp architecture and attention head
            counts, instead of reading them from ``base`` (all three together).

    Returns the written path. :class:`AdapterError` when the base cannot be told, when its
    architecture has no tested conversion, or for an adapter llama.cpp cannot apply.
    """
    import gguf

    adapter_dir = Path(adapter_dir)
    config = read_adapter_config(adapter_dir)
    weights_path = adapter_dir / "adapter_model.safetensors"
    if not weights_path.is_file():
        raise AdapterError(f"expected {weights_path}, got no such file")
    if architecture is not None:
        if architecture not in set(GGUF_ARCHITECTURES.values()):
            raise AdapterError(
                f"expected architecture to be one of {sorted(set(GGUF_ARCHITECTURES.values()))}, "
                f"got {architecture!r}"
            )
        if architecture in PERMUTED and not (n_head and n_head_kv):
            raise AdapterError(
                f"the {architecture!r} architecture permutes Q and K by head: pass n_head and "
                "n_head_kv with it, or the base model (base=)"
            )
        shape = {"architecture": architecture, "n_head": n_head, "n_head_kv": n_head_kv}
    else:
        base = base if base is not None else adapter_base(adapter_dir)
        if base is None:
            raise AdapterError(
                f"cannot tell which base model the adapter in {adapter_dir} goes on (no "
                "rag_gym.json, and PEFT's base_model_name_or_path is not a local model): pass "
                "the base model's .gguf file (rag-gym train export ADAPTER --base FILE.gguf; "
                "Python: base=)"
            )
        shape = base_shape(base)
    arch = shape["architecture"]
    model_arch = next(a for a, name in gguf.MODEL_ARCH_NAMES.items() if name == arch)
    tensors = load_lora_tensors(weights_path)
    layers = [int(m) for m in re.findall(r"layers\.(\d+)\.", " ".join(tensors))]
    names_map = gguf.get_tensor_name_map(model_arch, max([*layers, 0]) + 1)
    out = Path(out) if out is not None else adapter_dir / "adapter.gguf"
    converted = []
    for key in sorted(tensors):
        m = _KEY.match(key)
        target = names_map.get_name(m.group("module")) if m is not None else None
        if target is None:
            raise AdapterError(
                f"{weights_path}: tensor {key!r} is not a LoRA weight of a linear layer the "
                f"{arch!r} architecture has in llama.cpp (gguf's tensor name map); it cannot be "
                "shipped to llama.cpp"
            )
        ab = m.group("ab")
        data = tensors[key].astype(np.float32)
        if ab == "B" and arch in PERMUTED and target.endswith(".attn_q"):
            data = _permute(data, int(shape["n_head"]))
        elif ab == "B" and arch in PERMUTED and target.endswith(".attn_k"):
            data = _permute(data, int(shape["n_head_kv"]))
        converted.append((f"{target}.weight.lora_{ab.lower()}", data.astype(np.float16)))
    if not converted:
        raise AdapterError(f"{weights_path} holds no LoRA weights")
    writer = gguf.GGUFWriter(str(out), arch)
    writer.add_string("general.type", "adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", float(config.get("lora_alpha", config.get("r", 8))))
    for name, data in converted:
        writer.add_tensor(name, data)
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


def adapter_gguf(adapter: str | Path, base: str | Path | None = None) -> Path:
    """The GGUF adapter file for ``adapter``: the file itself, or an adapter folder's
    ``adapter.gguf``, written from its PEFT weights for the base model ``base`` (a ``.gguf``
    file; default the one the folder names, :func:`adapter_base`) when the folder has none
    yet. It is written into the folder, or, for a checkpoint shipped with rag-gym or a folder
    this process may not write to, into :func:`~rag_gym.generation.lm.cache_dir`'s
    ``adapters/`` under a name of the adapter's content and the base. Whether it fits the base
    is :func:`check_adapter_fits`'s to say."""
    path = Path(adapter)
    if path.suffix == ".gguf":
        if not path.is_file():
            raise FileNotFoundError(f"no GGUF adapter at {path}")
        return path
    folder = resolve_adapter(path)
    gguf_path = folder / "adapter.gguf"
    if gguf_path.is_file():
        return gguf_path
    if inside_package(folder) or not os.access(folder, os.W_OK):
        gguf_path = _cached_gguf(folder, base)
        if gguf_path.is_file():
            return gguf_path
        gguf_path.parent.mkdir(parents=True, exist_ok=True)
    # written aside and renamed: another process loading the same adapter meanwhile (two
    # evaluations of one run) never maps a half-written file, which ends it with SIGBUS
    tmp = gguf_path.with_name(f".adapter.gguf.{os.getpid()}.tmp")
    try:
        lora_to_gguf(folder, tmp, base=base)
        tmp.replace(gguf_path)
    finally:
        tmp.unlink(missing_ok=True)
    return gguf_path


def inside_package(folder: Path) -> bool:
    """Whether ``folder`` is inside the package (a checkpoint shipped with rag-gym): files
    written there would outlive the package's own."""
    package = Path(__file__).resolve().parents[1]
    return folder.resolve().is_relative_to(package)


def _cached_gguf(folder: Path, base: str | Path | None) -> Path:
    """The cache's GGUF for the adapter in ``folder`` converted for ``base``: named by the
    folder and the SHA-256 of its weights, its config and the base file's path."""
    import hashlib

    from rag_gym.generation.lm import cache_dir

    digest = hashlib.sha256()
    for name in ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin"):
        if (folder / name).is_file():
            digest.update(name.encode() + b"\0" + (folder / name).read_bytes())
    digest.update(b"base\0" + (str(Path(base).resolve()) if base is not None else "").encode())
    return cache_dir() / "adapters" / f"{folder.name}-{digest.hexdigest()[:16]}" / "adapter.gguf"

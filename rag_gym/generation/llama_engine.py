"""The llama.cpp generation loop: prompts prefilled in canonical chunks with exact KV reuse, and
several sequences decoded in one batch.

**Canonical evaluation.** llama.cpp's result for a token can depend on the shape of the batch it
was computed in: with a LoRA adapter, a one-token batch takes other kernels than a longer one and
its logits differ by tenths. So a prompt's tokens are always evaluated the same way, whatever is
cached: in chunks of ``chunk`` tokens starting at multiples of ``chunk`` (absolute positions), a
last chunk of a single token joined to the chunk before it unless llama-cpp-python's own
512-token batches would leave that token alone too (:func:`chunks`). On CPUs where every batch
of two or more tokens computes a token alike, this gives the text ``Llama.create_completion``
gives from an empty cache. A chunk's keys and
values then depend only on the tokens up to its end, and a cached prefix is reused only up to a
chunk start of the new prompt, and only where it was computed as a whole chunk
(:func:`complete_end`): generated tokens, computed one at a time, are evaluated again as part of
the next prompt. Evaluation with and without the cache issue the same batches, so greedy output
is the same bit for bit.

**Reuse across episodes.** The engine keeps, besides its live cache, copies of recent prompts'
cells in host memory (:class:`Snapshots`, ``cache_mb`` at most), so that the prompts of a batch
of episodes, generated one after another on the same context, each continue from their own
previous turn. On a model with sliding-window attention (Gemma 3) llama.cpp keeps only the cells
the window still sees on those layers, so a prefix is reused only where the cache still holds
every cell the rest of the prompt attends to (:meth:`LlamaEngine._holds`); otherwise the prompt
is evaluated from position 0.

**Batched decoding.** :meth:`LlamaEngine.run` with ``batched=True`` decodes several sequences
together in one ``llama_batch`` (a second context with a unified KV cache of ``batch_ctx``
cells, ``parallel`` sequences at most; a prompt waits while the cells it may need are taken).
Each prompt is still prefilled on its own, in canonical chunks; the decode steps of several
sequences are batches of several tokens, which with a LoRA adapter are computed by other kernels
than the one-token steps of sequential decoding, so greedy text can differ from sequential
decoding. Batched decoding is therefore for sampled generation, or for a protocol that records
it.

The stopping rules are ``Llama.create_completion``'s: end-of-generation tokens, the first stop
string found in the text (cut off), ``max_tokens``, and text that ends inside a UTF-8 character
is never cut there.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rag_gym.generation import llama_compat as compat

#: default chunk size of canonical prompt evaluation, in tokens
CHUNK = 64
#: llama-cpp-python's default prompt batch (``n_batch``), in tokens
ALIGN = 512
#: tokens a reply may run past ``max_tokens`` to finish a UTF-8 character
MULTIBYTE = 4


def chunks(n: int, size: int, align: int = ALIGN) -> list[tuple[int, int]]:
    """The canonical chunks ``[start, end)`` of an ``n``-token prompt: starts at multiples of
    ``size``; a last chunk of one token is joined to the one before (``size + 1`` tokens),
    except when ``n - 1`` is a multiple of ``align`` (where batches of ``align`` tokens also
    leave the last token alone).

    >>> chunks(150, 64)
    [(0, 64), (64, 128), (128, 150)]
    >>> chunks(129, 64)
    [(0, 64), (64, 129)]
    >>> chunks(513, 256)
    [(0, 256), (256, 512), (512, 513)]
    """
    out = [(s, min(s + size, n)) for s in range(0, n, size)]
    if len(out) > 1 and out[-1][1] - out[-1][0] == 1 and (n - 1) % align:
        last = out.pop()
        out[-1] = (out[-1][0], last[1])
    return out


def complete_end(n: int, size: int, align: int = ALIGN) -> int:
    """How many of an ``n``-token prompt's tokens lie in whole ``size``-token chunks: the
    prefix whose cells any longer prompt starting with it computes the same way.

    >>> complete_end(150, 64), complete_end(129, 64), complete_end(128, 64), complete_end(40, 64)
    (128, 64, 128, 0)
    """
    if n == 0:
        return 0
    start, end = chunks(n, size, align)[-1]
    return end if end - start == size else start


def reuse_start(common: int, n: int, size: int, align: int = ALIGN) -> int:
    """Where evaluation of an ``n``-token prompt resumes when its first ``common`` tokens have
    canonical cells: the last chunk start of the prompt at or before ``common``.

    >>> reuse_start(100, 300, 64), reuse_start(300, 300, 64), reuse_start(10, 300, 64)
    (64, 256, 0)
    """
    best = 0
    for start, _ in chunks(n, size, align):
        if start <= common:
            best = start
    return best


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the common prefix of two token arrays."""
    m = min(len(a), len(b))
    diff = np.flatnonzero(a[:m] != b[:m])
    return int(diff[0]) if len(diff) else m


class Snapshots:
    """Copies of sequences' KV cells in host memory, keyed by the tokens they hold (least
    recently used dropped first past ``max_bytes``; a snapshot whose tokens begin a newer one's
    is dropped when the newer one is added)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: list[tuple[np.ndarray, Any]] = []

    def best(self, tokens: np.ndarray) -> tuple[int, Any]:
        """The longest common prefix with ``tokens`` among the snapshots, and that snapshot
        (``(0, None)`` when there is none)."""
        best, found = 0, None
        for i, (held, _) in enumerate(self._items):
            common = common_prefix(held, tokens)
            if common > best:
                best, found = common, i
        if found is None:
            return 0, None
        item = self._items.pop(found)  # most recently used last
        self._items.append(item)
        return best, item[1]

    def add(self, tokens: np.ndarray, data: Any) -> None:
        self._items = [
            (held, d)
            for held, d in self._items
            if not (len(held) <= len(tokens) and common_prefix(held, tokens) == len(held))
        ]
        self._items.append((tokens, data))
        while len(self._items) > 1 and sum(len(d) for _, d in self._items) > self.max_bytes:
            self._items.pop(0)

    def __len__(self) -> int:
        return len(self._items)


@dataclass(frozen=True)
class Request:
    """One completion: prompt tokens and ``Llama.create_completion``'s options."""

    tokens: Sequence[int]
    max_tokens: int
    temperature: float
    top_p: float
    stop: tuple[str, ...]
    seed: int


@dataclass
class Completion:
    """Its text, token counts and ``finish_reason`` (``stop`` or ``length``)."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str


class _Text:
    """``Llama.create_completion``'s stopping rules, fed one sampled token at a time."""

    def __init__(self, llm: Any, request: Request, n_ctx: int) -> None:
        import llama_cpp

        self._llm = llm
        self._eog = lambda t: llama_cpp.llama_vocab_is_eog(llm._model.vocab, t)
        self.request = request
        self.tokens: list[int] = []
        self.stops = [s.encode("utf-8") for s in request.stop]
        self.multibyte_fix = 0
        self.text = b""
        self.finish: str | None = None
        self.room = n_ctx - len(request.tokens)

    def feed(self, token: int) -> bool:
        """Take a sampled token; True when the completion is over (``token`` is not to be
        evaluated)."""
        if self._eog(token):
            self.text = self._llm.detokenize(self.tokens)
            self.finish = "stop"
            return True
        self.tokens.append(token)
        all_text = self._llm.detokenize(self.tokens)
        for k, char in enumerate(all_text[-3:]):
            k = 3 - k
            for num, pattern in ((2, 192), (3, 224), (4, 240)):
                if num > k and pattern & char == pattern:
                    self.multibyte_fix = num - k
        if self.multibyte_fix > 0:  # the text ends inside a character: never cut it there
            self.multibyte_fix -= 1
            if len(self.tokens) < min(self.room, self.request.max_tokens + MULTIBYTE):
                return False
        found = [s for s in self.stops if s in all_text]
        if found:
            self.text = all_text[: all_text.index(found[0])]
            self.finish = "stop"
            return True
        if len(self.tokens) >= self.request.max_tokens or len(self.tokens) >= self.room:
            self.text = all_text
            self.finish = "length"
            return True
        return False

    def result(self) -> Completion:
        assert self.finish is not None
        return Completion(
            text=self.text.decode("utf-8", errors="ignore"),
            prompt_tokens=len(self.request.tokens),
            completion_tokens=len(self.tokens),
            finish_reason=self.finish,
        )


class LlamaEngine:
    """Generation on a loaded ``llama_cpp.Llama`` (see the module doc).

    Args:
        llm: the model; its own context runs sequential generation.
        chunk: tokens per canonical prefill chunk.
        kv_reuse: continue from cached cells (exact; off evaluates every prompt from position 0
            in the same chunks).
        cache_mb: host memory for :class:`Snapshots` of earlier prompts' cells.
        parallel: sequences decoded together at most (batched decoding).
        batch_ctx: KV cells shared by the batched sequences (made on first use).
    """

    def __init__(
        self,
        llm: Any,
        chunk: int = CHUNK,
        kv_reuse: bool = True,
        cache_mb: int = 256,
        parallel: int = 8,
        batch_ctx: int | None = None,
    ) -> None:
        if not isinstance(chunk, int) or not 2 <= chunk < llm.n_batch:
            raise ValueError(f"expected 2 <= chunk < n_batch ({llm.n_batch}), got {chunk!r}")
        if not isinstance(parallel, int) or parallel < 1:
            raise ValueError(f"expected parallel >= 1, got {parallel!r}")
        self.llm = llm
        self.n_ctx = llm.n_ctx()
        self.chunk = chunk
        self.align = llm.n_batch
        self.kv_reuse = kv_reuse
        self.parallel = parallel
        self.batch_ctx = batch_ctx or 2 * self.n_ctx
        if self.batch_ctx < self.n_ctx:
            raise ValueError(f"expected batch_ctx >= n_ctx ({self.n_ctx}), got {batch_ctx!r}")
        self.snapshots = Snapshots(cache_mb * 2**20)
        self._ctx = compat.main_context(llm)
        self._live: np.ndarray | None = None  # tokens with canonical cells in the live cache
        self._window: int | None = None  # the model's sliding attention window, once read
        self._batch = compat.Batch(llm.n_batch)
        self._bctx: Any = None
        self._bbatch: compat.Batch | None = None
        #: tokens prefilled, reused from the cache and decoded, snapshots restored, and the
        #: seconds spent in prefill and decode steps
        self.stats: dict[str, float] = dict.fromkeys(
            ("prefilled", "reused", "decoded", "restored", "prefill_s", "decode_s"), 0
        )

    def contexts(self) -> list[Any]:
        """The contexts this engine made besides the model's own (the batched one, once used)."""
        return [self._bctx] if self._bctx is not None else []

    def invalidate(self) -> None:
        """Forget the live cache (something else decoded on ``llm``'s context)."""
        self._live = None

    # -- prefill --
    def _prefill(
        self,
        ctx: Any,
        batch: compat.Batch,
        tokens: Sequence[int],
        start: int,
        seq: int,
        stop_at: int | None = None,
    ) -> int:
        """Evaluate the canonical chunks of ``tokens`` from ``start`` (a chunk start) into
        ``seq``; with ``stop_at``, only the chunks ending at or before it. Returns where it
        stopped."""
        pos = start
        for s, e in chunks(len(tokens), self.chunk, self.align):
            if s < start:
                continue
            if stop_at is not None and e > stop_at:
                break
            batch.clear()
            for p in range(s, e):
                batch.add(tokens[p], p, seq, p == e - 1)
            t0 = time.perf_counter()
            compat.decode(ctx, batch)
            self.stats["prefill_s"] += time.perf_counter() - t0
            self.stats["prefilled"] += e - s
            pos = e
        return pos

    def _sequential(self, request: Request) -> Completion:
        llm, ctx = self.llm, self._ctx
        tokens = np.asarray(request.tokens, dtype=np.int64)
        n = len(tokens)
        start = 0
        if self.kv_reuse:
            live = common_prefix(self._live, tokens) if self._live is not None else 0
            saved, data = self.snapshots.best(tokens)
            if reuse_start(saved, n, self.chunk, self.align) > reuse_start(
                live, n, self.chunk, self.align
            ):
                compat.clear(ctx)
                compat.restore(ctx, data, 0)
                self.stats["restored"] += 1
                live = saved
            start = reuse_start(live, n, self.chunk, self.align)
        if start > 0:
            compat.seq_rm(ctx, 0, start)
            if not self._holds(ctx, start):
                start = 0
        if start == 0:
            compat.clear(ctx)
        self.stats["reused"] += start
        done = complete_end(n, self.chunk, self.align)
        pos = self._prefill(ctx, self._batch, request.tokens, start, 0, stop_at=done)
        self._live = tokens[:pos]
        if self.kv_reuse and pos > start:
            self.snapshots.add(tokens[:pos], compat.snapshot(ctx, 0))
        self._prefill(ctx, self._batch, request.tokens, pos, 0)
        text = _Text(llm, request, self.n_ctx)
        sampler = compat.sampler(
            llm,
            request.seed,
            request.temperature,
            request.top_p,
            1 if request.temperature == 0 else 40,
        )
        pos = n
        while True:
            token = sampler.sample(ctx, -1)
            if text.feed(token):
                break
            self._batch.clear()
            self._batch.add(token, pos, 0, True)
            t0 = time.perf_counter()
            compat.decode(ctx, self._batch)
            self.stats["decode_s"] += time.perf_counter() - t0
            self.stats["decoded"] += 1
            pos += 1
        compat.forget_eval(llm)
        return text.result()

    def _holds(self, ctx: Any, start: int) -> bool:
        """Whether sequence 0's cells are all a prompt resumed at ``start`` attends to: every
        position before ``start``, or on a sliding-window model (whose window layers keep only
        the cells the window still sees, :func:`~rag_gym.generation.llama_compat.seq_span`)
        the ``window - 1`` before it."""
        if self._window is None:
            self._window = compat.sliding_window(self.llm)
        first, last = compat.seq_span(ctx, 0)
        need = max(0, start - self._window + 1) if self._window else 0
        return 0 <= first <= need and last >= start - 1

    def _batched(self, requests: Sequence[Request]) -> list[Completion]:
        llm = self.llm
        if self._bctx is None:
            self._bctx = compat.new_context(llm, self.batch_ctx, self.parallel)
            self._bbatch = compat.Batch(max(llm.n_batch, self.parallel))
        ctx, batch = self._bctx, self._bbatch
        assert batch is not None
        compat.clear(ctx)
        waiting = deque(range(len(requests)))
        free = list(range(self.parallel))
        taken = 0
        running: dict[int, dict[str, Any]] = {}
        out: list[Completion | None] = [None] * len(requests)

        def finish(seq: int) -> None:
            nonlocal taken
            st = running.pop(seq)
            out[st["i"]] = st["text"].result()
            compat.seq_rm(ctx, seq, -1, -1)
            free.append(seq)
            taken -= st["need"]

        while waiting or running:
            while waiting and free:
                req = requests[waiting[0]]
                need = len(req.tokens) + req.max_tokens + MULTIBYTE
                if running and taken + need > self.batch_ctx:
                    break
                i = waiting.popleft()
                seq = free.pop()
                taken += need
                self._prefill(ctx, batch, req.tokens, 0, seq)
                text = _Text(llm, req, self.n_ctx)
                sampler = compat.sampler(
                    llm, req.seed, req.temperature, req.top_p, 1 if req.temperature == 0 else 40
                )
                token = sampler.sample(ctx, -1)
                running[seq] = {
                    "i": i,
                    "text": text,
                    "sampler": sampler,
                    "need": need,
                    "pos": len(req.tokens),
                    "token": token,
                }
                if text.feed(token):
                    finish(seq)
            if not running:
                continue
            batch.clear()
            index = {}
            for seq, st in running.items():
                index[seq] = batch.add(st["token"], st["pos"], seq, True)
            t0 = time.perf_counter()
            compat.decode(ctx, batch)
            self.stats["decode_s"] += time.perf_counter() - t0
            self.stats["decoded"] += len(index)
            for seq, i in index.items():
                st = running[seq]
                st["pos"] += 1
                st["token"] = st["sampler"].sample(ctx, i)
                if st["text"].feed(st["token"]):
                    finish(seq)
        return [c for c in out if c is not None]

    def run(self, requests: Sequence[Request], batched: bool = False) -> list[Completion]:
        """Complete each request (prompt shorter than the context window, ``max_tokens``
        fitting in it): one after another on the model's context, or decoded together."""
        try:
            if batched and len(requests) > 1:
                return self._batched(requests)
            return [self._sequential(r) for r in requests]
        except BaseException:
            self._live = None  # the cache may hold half a prompt: trust nothing in it
            raise

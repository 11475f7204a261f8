"""Generators for rollouts: continue token sequences with the policy being trained.

:class:`EngineGenerator` generates with ``transformers`` on rag-gym's continuous-batching engine
(:class:`~rag_gym.generation.transformers_lm.TransformersLM`), each episode's keys and values kept
from turn to turn; :class:`HFGenerator` with ``model.generate`` on left-padded batches (any model,
``top_k``); :class:`VLLMGenerator` on TRL's colocated vLLM engine (a GPU);
:func:`make_generator` picks between the first two, and :func:`generation_info` records which one ran and
why the engine did not.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

Generate = Callable[[list[list[int]], int, Sequence[str]], list[list[int]]]


class Generator(Protocol):
    """Continue each token sequence by at most ``max_new_tokens`` tokens; stop a row early at
    any of ``stop`` (kept) or at the end-of-sequence token (kept). Returns the new tokens."""

    def __call__(
        self, sequences: list[list[int]], max_new_tokens: int, stop: Sequence[str]
    ) -> list[list[int]]: ...


@contextlib.contextmanager
def eval_mode(model: Any) -> Iterator[None]:
    """``model`` in eval mode inside the block (no dropout while sampling from a policy in
    training), and back in the mode it was in afterwards."""
    training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(training)


class EngineGenerator:
    """Multi-turn generation that computes each token once per rollout: the policy on
    :class:`~rag_gym.generation.transformers_lm.TransformersLM`'s continuous-batching engine, with
    each episode's keys and values kept across its turns.

    :meth:`RolloutEngine.play` opens a :meth:`session` for the whole rollout; turn ``t + 1``'s
    sequence is turn ``t``'s plus the reply and the observation, so only the observation and the
    new reply are computed (:class:`HFGenerator` re-computes the whole episode every turn, which
    makes a multi-turn step cost about twice a single-turn one). Outside a session every call
    starts clean, so weights changed between calls are never read from a stale cache.

    Sampling matches :class:`HFGenerator`'s (temperature, ``top_p``; ``top_k`` is not
    supported: :func:`make_generator` picks :class:`HFGenerator` for it); each row has its own
    random stream, seeded from torch's global generator, so runs under a fixed seed repeat.

    Args:
        model: a causal LM (PEFT-wrapped or not) that the engine can drive
            (``TransformersLM.from_model(...).engine_enabled``).
        tokenizer: its tokenizer.
        temperature: 0 decodes greedily.
        top_p: nucleus sampling mass.
        batch_size: rows decoded together, and episodes whose caches are kept; a rollout of
            more episodes still works, re-computing the episodes whose slot was taken.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        temperature: float = 1.0,
        top_p: float = 1.0,
        batch_size: int = 16,
    ) -> None:
        from rag_gym.generation.transformers_lm import TransformersLM

        if not isinstance(temperature, (int, float)) or temperature < 0:
            raise ValueError(f"expected temperature >= 0, got {temperature!r}")
        self.model = model
        self.tokenizer = tokenizer
        self.temperature = float(temperature)
        self.top_p = float(top_p)
        self.lm = TransformersLM.from_model(model, tokenizer, batch_size=batch_size)
        self.tokens_generated = 0
        self._merged = False

    @property
    def usable(self) -> bool:
        """Whether the engine runs this model (else use :class:`HFGenerator`)."""
        return self.lm.engine_enabled

    @contextlib.contextmanager
    def session(self) -> Iterator[EngineGenerator]:
        """Keep each episode's keys and values across the calls inside (one rollout), with the
        LoRA adapters merged (:meth:`merged`) for all of it."""
        with self.merged(), self.lm.session():
            yield self

    def run_clients(self, clients: Sequence[Callable[[], None]]) -> None:
        """Run ``clients`` (each plays one episode, calling this generator once per turn) as
        one continuously batched generation: :meth:`TransformersLM.run_clients`. Clients run
        one at a time in a fixed order, so sampled rollouts repeat under a fixed seed."""
        with eval_mode(self.model), self.merged():
            self.lm.run_clients(clients)

    @contextlib.contextmanager
    def merged(self) -> Iterator[None]:
        """LoRA adapters merged into their base weights while generating.

        A LoRA layer otherwise runs three matrix products per linear layer (base, A, B): with
        SmolLM2 on CPU a decoding step takes about 1.5 times as long. The base weights are
        copied first and copied back afterwards, so they come out bit for bit as they were
        (PEFT's own unmerge subtracts the update again, which drifts by a rounding error each
        time). The copy costs the adapted layers' weights once more in memory during the
        rollout; for large models on a GPU, generate with vLLM instead. No-op for a model
        without LoRA layers, or inside another ``merged`` block.
        """
        try:
            from peft.tuners.lora import LoraLayer
        except ImportError:
            LoraLayer = None
        layers = (
            [m for m in self.model.modules() if isinstance(m, LoraLayer) and not m.merged]
            if LoraLayer is not None and not self._merged
            else []
        )
        if not layers:
            yield
            return
        import torch

        weights = [m.get_base_layer().weight for m in layers]
        saved = [w.detach().clone() for w in weights]
        self._merged = True
        try:
            with torch.no_grad():
                for m in layers:
                    m.merge()
            yield
        finally:
            with torch.no_grad():
                for m in layers:
                    if m.merged:
                        m.unmerge()
                for w, copy in zip(weights, saved, strict=True):
                    w.copy_(copy)
            self._merged = False

    def __call__(
        self, sequences: list[list[int]], max_new_tokens: int, stop: Sequence[str]
    ) -> list[list[int]]:
        import torch

        from rag_gym.generation.lm import GenerationConfig

        config = GenerationConfig(
            max_tokens=max_new_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            stop=tuple(stop),
            seed=int(torch.randint(0, 2**62, ()).item()),
        )
        with eval_mode(self.model), self.merged():
            out = [tokens for tokens, _ in self.lm.generate_ids(sequences, config)]
        self.tokens_generated += sum(len(t) for t in out)
        return out


def make_generator(
    model: Any,
    tokenizer: Any,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    batch_size: int = 16,
) -> EngineGenerator | HFGenerator:
    """The generator for rollouts: :class:`EngineGenerator` when the engine runs ``model`` and
    no ``top_k`` is asked, else :class:`HFGenerator`. When the engine cannot run the model, the
    engine warns and the :class:`HFGenerator` keeps the reason in ``engine_fallback``
    (:func:`generation_info` reports it)."""
    fallback = None
    if not top_k:
        engine = EngineGenerator(model, tokenizer, temperature, top_p, batch_size)
        if engine.usable:
            return engine
        fallback = engine.lm.engine_fallback
    hf = HFGenerator(model, tokenizer, temperature, top_p, top_k, batch_size)
    hf.engine_fallback = fallback
    return hf


def generation_info(generator: Any) -> dict[str, Any]:
    """What a run records about how it generated: ``{"generator": class name,
    "engine_fallback": why the continuous-batching engine was not used, or None}``."""
    return {
        "generator": type(generator).__name__,
        "engine_fallback": getattr(generator, "engine_fallback", None),
    }


class HFGenerator:
    """Batched generation with a ``transformers`` model (the policy being trained).

    Args:
        model: a causal LM (PEFT-wrapped or not).
        tokenizer: its tokenizer; its pad token is used for left padding.
        temperature: 0 decodes greedily.
        top_p, top_k: sampling filters (``top_k=0`` disables it).
        batch_size: rows per forward batch.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        batch_size: int = 16,
    ) -> None:
        if not isinstance(temperature, (int, float)) or temperature < 0:
            raise ValueError(f"expected temperature >= 0, got {temperature!r}")
        self.model = model
        self.tokenizer = tokenizer
        self.temperature = float(temperature)
        self.top_p = float(top_p)
        self.top_k = int(top_k)
        self.batch_size = batch_size
        self.tokens_generated = 0
        self.engine_fallback: str | None = None
        """Why :func:`make_generator` did not use the engine (``None``: not asked for it)."""
        self._criteria: dict[tuple[str, ...], Any] = {}

    def _stopping(self, stop: Sequence[str]) -> Any:
        """transformers' stop-string criterion, built once per stop tuple: building it reads and
        indexes the whole vocabulary (about a second for SmolLM2), which ``stop_strings=`` would
        redo on every ``generate`` call."""
        key = tuple(stop)
        if key not in self._criteria:
            from transformers import StoppingCriteriaList, StopStringCriteria

            self._criteria[key] = StoppingCriteriaList(
                [StopStringCriteria(tokenizer=self.tokenizer, stop_strings=list(key))]
            )
        return self._criteria[key]

    def __call__(
        self, sequences: list[list[int]], max_new_tokens: int, stop: Sequence[str]
    ) -> list[list[int]]:
        out: list[list[int]] = []
        # Similar lengths together waste less padding; results go back in the input order.
        order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
        results: dict[int, list[int]] = {}
        for start in range(0, len(order), self.batch_size):
            chunk = order[start : start + self.batch_size]
            for i, tokens in zip(
                chunk, self._batch([sequences[i] for i in chunk], max_new_tokens, stop), strict=True
            ):
                results[i] = tokens
        out = [results[i] for i in range(len(sequences))]
        self.tokens_generated += sum(len(t) for t in out)
        return out

    def _batch(
        self, sequences: list[list[int]], max_new_tokens: int, stop: Sequence[str]
    ) -> list[list[int]]:
        import torch

        tok = self.tokenizer
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        width = max(len(s) for s in sequences)
        device = next(self.model.parameters()).device
        ids = torch.full((len(sequences), width), pad, dtype=torch.long)
        mask = torch.zeros((len(sequences), width), dtype=torch.long)
        for row, seq in enumerate(sequences):
            ids[row, width - len(seq) :] = torch.tensor(seq, dtype=torch.long)
            mask[row, width - len(seq) :] = 1
        kwargs: dict[str, Any] = {
            "max_new_tokens": max_new_tokens,
            "pad_token_id": pad,
            "eos_token_id": tok.eos_token_id,
        }
        if stop:
            kwargs["stopping_criteria"] = self._stopping(stop)
        if self.temperature > 0:
            kwargs.update(
                do_sample=True, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k
            )
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        with eval_mode(self.model), torch.no_grad():
            out = self.model.generate(
                input_ids=ids.to(device), attention_mask=mask.to(device), **kwargs
            )
        return [self._trim(row.tolist(), stop) for row in out[:, width:].cpu()]

    def _trim(self, tokens: list[int], stop: Sequence[str]) -> list[int]:
        """The generated tokens up to and including the first stop string or end token (the rest
        is padding)."""
        eos = self.tokenizer.eos_token_id
        end = tokens.index(eos) + 1 if eos in tokens else len(tokens)
        tokens = tokens[:end]
        if not stop:
            return tokens
        decode = self.tokenizer.decode
        if not any(s in decode(tokens) for s in stop):
            return tokens
        lo, hi = 1, len(tokens)  # smallest prefix whose text holds a stop string
        while lo < hi:
            mid = (lo + hi) // 2
            if any(s in decode(tokens[:mid]) for s in stop):
                hi = mid
            else:
                lo = mid + 1
        return tokens[:lo]


class VLLMGenerator:
    """Multi-turn generation through TRL's vLLM engine (``use_vllm=True``, colocate mode).

    Untested in CI (no GPU there); it calls the same engine TRL uses for single-turn GRPO.
    """

    def __init__(self, trainer: Any, tokenizer: Any) -> None:
        self.trainer = trainer
        self.tokenizer = tokenizer

    def __call__(
        self, sequences: list[list[int]], max_new_tokens: int, stop: Sequence[str]
    ) -> list[list[int]]:
        from vllm import SamplingParams

        from rag_gym.train.trl_compat import colocated_vllm

        llm = colocated_vllm(self.trainer)
        params = SamplingParams(
            temperature=self.trainer.args.temperature,
            top_p=self.trainer.args.top_p,
            max_tokens=max_new_tokens,
            stop=list(stop) or None,
            include_stop_str_in_output=True,
        )
        outputs = llm.generate([{"prompt_token_ids": s} for s in sequences], params, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outputs]

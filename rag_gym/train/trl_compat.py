"""Everything rag-gym's trainers take from TRL beyond its public API, in one place.

The trainers extend TRL through its public hooks: GRPO's ``rollout_func`` (multi-turn episodes)
with the ``env_mask`` field of its output (env-written tokens left out of the loss), its
``loss_type`` values (``"grpo"``, ``"dapo"``), ``mask_truncated_completions``, reward functions
and callbacks; DPO's collator of token-id rows and its ``ref_chosen_logps`` /
``ref_rejected_logps`` columns. These things have no public hook in the TRL versions below, and
live here:

* **ARENA's stabilised KL** (:class:`~rag_gym.train.grpo.EnvGRPOConfig` ``kl_estimator=
  "stabilized"``): TRL computes only the k3 estimator, so the trainer reads the policy's
  per-token log-probabilities (``GRPOTrainer._get_per_token_logps_and_entropies``), runs
  ``GRPOTrainer._compute_loss`` with β = 0 and adds β·k2 with TRL's token aggregation of the
  ``loss_type`` (:func:`aggregate`, a copy of the aggregation inside ``_compute_loss``; a test
  checks it against TRL's own on the installed version).
* **DPO on rows that are already token ids** (EVO-RAG's policy pairs, whose prompt is the exact
  token context of a rollout): ``DPOTrainer._prepare_dataset`` would re-tokenise them, and
  ``DPOTrainer._precompute_ref_logps`` would overwrite the reference-free log-probabilities
  (0) the rows carry.
* **Undoing what a DPO epoch leaves on a PEFT model** (:func:`drop_dpo_state`): the frozen
  ``"ref"`` adapter copy TRL adds, and the fused LM head it binds to the base model's
  ``forward``, so the next epoch starts from the same model.
* **Log-probabilities at model-written tokens only** (:func:`env_grpo_trainer_class`): TRL's
  fused LM head scores every completion token, env-written ones included, and on a device
  without Triton (a CPU) every position of the sequence, though the loss, the KL and the
  metrics read only the model's tokens. The trainer marks the others ``-100`` in the labels
  (``GRPOTrainer._get_per_token_logps_and_entropies``, given the rollout's ``env_mask`` through
  ``GRPOTrainer._generate`` and ``_compute_loss``) and lets the head skip them
  (``trl.trainer.utils._use_triton``, read when the head runs).
* **SFT's loss at the trained positions only** (:func:`sft_trainer_class`): the same skip for
  ``SFTTrainer``, whose labels are already ``-100`` outside the model's replies.
* **Multi-turn generation on TRL's colocated vLLM engine** (:func:`colocated_vllm`): the
  ``LLM`` object TRL keeps at ``trainer.vllm_generation.llm``.

:data:`SUPPORTED` is the TRL range these were written and tested against (the floor also has
``rollout_func`` and ``env_mask``). :func:`require_trl` refuses another version with the fix;
:func:`check_private_api` checks the private methods' signatures (:data:`PRIVATE_API`), which a
test also pins, so an upgrade fails loudly instead of training wrong.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
from collections.abc import Callable, Iterator
from typing import Any

#: The TRL versions the private hooks below are written for and tested with (PEP 440).
SUPPORTED = ">=1.16,<1.17"
#: Set to 1 to train with a TRL outside :data:`SUPPORTED` (at your own risk).
ALLOW_ENV = "RAG_GYM_ALLOW_UNTESTED_TRL"
#: The private methods used, as ``(class name, method): parameter names`` (``self`` first).
PRIVATE_API: dict[tuple[str, str], tuple[str, ...]] = {
    ("GRPOTrainer", "_compute_loss"): ("self", "model", "inputs"),
    ("GRPOTrainer", "_get_per_token_logps_and_entropies"): (
        "self",
        "model",
        "input_ids",
        "attention_mask",
        "logits_to_keep",
        "batch_size",
        "compute_entropy",
        "compute_aux_loss",
    ),
    ("GRPOTrainer", "_generate"): ("self", "prompts"),
    ("GRPOTrainer", "_generate_and_score_completions"): ("self", "inputs"),
    ("DPOTrainer", "_prepare_dataset"): (
        "self",
        "dataset",
        "processing_class",
        "args",
        "dataset_name",
    ),
    ("DPOTrainer", "_precompute_ref_logps"): ("self", "dataset", "name", "batch_size"),
}
#: The loss types :func:`aggregate` knows (TRL's token aggregations).
AGGREGATED_LOSS_TYPES = ("grpo", "sapo", "bnpo", "dr_grpo", "dapo", "cispo", "vespo")


def checkpointing_option(config_class: type, enabled: bool) -> dict[str, bool]:
    """The training-arguments keyword that turns activation checkpointing on or off, for
    ``config_class`` (a ``TrainingArguments`` subclass such as TRL's ``GRPOConfig``).

    transformers 5.24 renamed ``gradient_checkpointing`` to ``activation_checkpointing``; the old
    name warns there, and TRL's configs default it to ``True``, so the new name must be given
    explicitly wherever it exists (older transformers know only the old name).
    """
    import dataclasses

    names = {f.name for f in dataclasses.fields(config_class)}
    key = (
        "activation_checkpointing"
        if "activation_checkpointing" in names
        else "gradient_checkpointing"
    )
    return {key: bool(enabled)}


class TRLVersionError(ImportError):
    """The installed TRL is outside :data:`SUPPORTED`, or its private methods changed."""


def check_version(version: str) -> None:
    """Raise :class:`TRLVersionError` when TRL ``version`` is outside :data:`SUPPORTED` (unless
    ``$RAG_GYM_ALLOW_UNTESTED_TRL`` is 1).

    >>> check_version("1.16.0")
    >>> check_version("0.19.0")
    Traceback (most recent call last):
    ...
    rag_gym.train.trl_compat.TRLVersionError: expected trl >=1.16,<1.17 (the versions rag-gym's trainers are tested with), got trl 0.19.0; install it with pip install 'trl>=1.16,<1.17' (or set RAG_GYM_ALLOW_UNTESTED_TRL=1 to try this one)
    """
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    if Version(version) in SpecifierSet(SUPPORTED) or os.environ.get(ALLOW_ENV) == "1":
        return
    raise TRLVersionError(
        f"expected trl {SUPPORTED} (the versions rag-gym's trainers are tested with), got trl "
        f"{version}; install it with pip install 'trl{SUPPORTED}' (or set {ALLOW_ENV}=1 to try "
        "this one)"
    )


def require_trl() -> Any:
    """Import TRL (and PEFT and datasets), check its version, return the ``trl`` module."""
    try:
        import datasets  # noqa: F401
        import peft  # noqa: F401
        import trl
    except ImportError as exc:
        raise ImportError(
            "training needs trl, peft and datasets: pip install torch==2.13.0 && "
            "pip install 'rag-gym[train]'"
        ) from exc
    check_version(trl.__version__)
    return trl


def check_private_api(trl: Any) -> None:
    """Raise :class:`TRLVersionError` when a method of :data:`PRIVATE_API` is missing or its
    leading parameters changed in the installed ``trl``."""
    for (cls_name, method), expected in PRIVATE_API.items():
        fn = getattr(getattr(trl, cls_name), method, None)
        got = tuple(inspect.signature(fn).parameters)[: len(expected)] if fn else None
        if got != expected:
            raise TRLVersionError(
                f"expected trl.{cls_name}.{method}{expected}, got {got} in trl "
                f"{trl.__version__}; install trl{SUPPORTED}: pip install 'trl{SUPPORTED}'"
            )


def aggregate(trainer: Any, x: Any, mask: Any, inputs: dict[str, Any]) -> Any:
    """``x`` (per-token values, ``(B, T)``) reduced to a scalar as TRL's ``_compute_loss``
    reduces the per-token loss of ``trainer.loss_type``, gradient-accumulation scaling
    included."""
    if trainer.loss_type not in AGGREGATED_LOSS_TYPES:
        raise ValueError(
            f"expected a loss_type in {AGGREGATED_LOSS_TYPES} for the stabilized KL, got "
            f"{trainer.loss_type!r}"
        )
    train = trainer.model.training
    accumulation = trainer.current_gradient_accumulation_steps if train else 1.0
    if trainer.loss_type in ("grpo", "sapo"):
        return ((x * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean() / accumulation
    if trainer.loss_type == "bnpo":
        return (x * mask).sum() / mask.sum().clamp(min=1.0) / accumulation
    if trainer.loss_type == "dr_grpo":
        return (x * mask).sum() / (x.size(0) * trainer.max_completion_length) / accumulation
    normalizer = inputs["num_items_in_batch"].clamp(min=1.0) / trainer.accelerator.num_processes
    if train:
        normalizer = normalizer * accumulation / trainer.args.steps_per_generation
    return (x * mask).sum() / normalizer


@contextlib.contextmanager
def compact_fused_head() -> Iterator[None]:
    """Inside the block, TRL's fused LM head projects only the positions whose label is not
    ``-100``, on every device (TRL itself does so on Triton devices only, and elsewhere scores
    every position so that its tile shapes stay fixed for compilers such as Neuron's)."""
    import trl.trainer.utils as utils

    original = utils._use_triton
    utils._use_triton = lambda device: True
    try:
        yield
    finally:
        utils._use_triton = original


def _check_fused_head_hook(trl: Any) -> None:
    """Raise :class:`TRLVersionError` unless the installed TRL has the private switch
    :func:`compact_fused_head` sets."""
    import trl.trainer.utils as utils

    if not callable(getattr(utils, "_use_triton", None)):
        raise TRLVersionError(
            f"expected trl.trainer.utils._use_triton in trl {trl.__version__}; install "
            f"trl{SUPPORTED}: pip install 'trl{SUPPORTED}'"
        )


@functools.cache
def sft_trainer_class() -> type:
    """``CompactSFTTrainer``: TRL's ``SFTTrainer`` whose loss projects the LM head at the
    trained positions only, on every device (:func:`compact_fused_head`). A transcript's trained
    tokens (the model's replies) are a fifth of it, and the head is most of a large-vocabulary
    model's work (Gemma 3 270M: 262,144 × 640 per position), so a CPU step takes 2.5 to 3.7
    times less; the loss, its gradients and the logged entropy and accuracy are TRL's own (the
    head's rows are independent; a test compares them)."""
    trl = require_trl()
    _check_fused_head_hook(trl)

    class CompactSFTTrainer(trl.SFTTrainer):
        def compute_loss(self, *args: Any, **kwargs: Any) -> Any:
            with compact_fused_head():
                return super().compute_loss(*args, **kwargs)

    return CompactSFTTrainer


@functools.cache
def env_grpo_trainer_class() -> type:
    """``EnvGRPOTrainer``, built on first use (it subclasses ``trl.GRPOTrainer``)."""
    trl = require_trl()
    check_private_api(trl)
    _check_fused_head_hook(trl)

    class EnvGRPOTrainer(trl.GRPOTrainer):
        """TRL's ``GRPOTrainer`` that computes the policy's and the reference's per-token
        log-probabilities at the model-written tokens of an episode only.

        A multi-turn episode's completion is mostly env-written tokens (passages): on HotpotQA
        about 150 of 800. The loss, the KL and the entropy metric weigh every token by
        ``completion_mask * env_mask``, so the log-probabilities TRL computes at the others are
        multiplied by zero. Here they are not computed: their labels are ``-100`` and the fused
        LM head skips them (:func:`compact_fused_head`), which leaves them 0. The tokens that
        count get the same values as TRL's (the head's rows are independent), so the step is
        the same; the LM head's work (a 576 × 49,152 product per position for SmolLM2) and its
        backward shrink to the model's tokens. Rows with images, or calls without a known mask,
        take TRL's path.
        """

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._scoring_mask: Any = None
            self._generated_env_mask: list[list[int]] | None = None
            self._generated_fields: dict[str, Any] = {}
            self.credit: Callable[..., Any] | None = None
            """``credit(advantages, width, fields, scale_rewards)``: the ``(rows, width)``
            per-token advantages that replace TRL's per-episode ``advantages`` (``fields``: the
            rollout function's extra fields, in the batch's order); None keeps TRL's."""

        def _generate(self, prompts: list) -> Any:
            out = super()._generate(prompts)
            self._generated_env_mask = out[2]  # the rollout's env_mask, in the batch's order
            self._generated_fields = out[5] or {}
            return out

        def _generate_and_score_completions(self, inputs: Any) -> Any:
            try:
                output = super()._generate_and_score_completions(inputs)
                if self.credit is not None:
                    output["advantages"] = self.credit(
                        output["advantages"],
                        output["completion_ids"].size(1),
                        self._generated_fields,
                        self.scale_rewards,
                    )
                return output
            finally:
                self._generated_env_mask = None
                self._generated_fields = {}

        def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> Any:
            if "tool_mask" in inputs:
                self._scoring_mask = inputs["completion_mask"] * inputs["tool_mask"]
            try:
                return super()._compute_loss(model, inputs)
            finally:
                self._scoring_mask = None

        def _mask_for(self, rows: int, width: int) -> Any:
            """The ``(rows, width)`` mask of the tokens that count, or None when not known."""
            import torch

            mask = self._scoring_mask
            if mask is None and self._generated_env_mask is not None:
                masks = self._generated_env_mask
                mask = torch.zeros((len(masks), width), dtype=torch.long)
                for i, m in enumerate(masks):
                    mask[i, : min(len(m), width)] = torch.as_tensor(m[:width], dtype=torch.long)
            if mask is None or tuple(mask.shape) != (rows, width):
                return None
            return mask

        def _get_per_token_logps_and_entropies(
            self,
            model: Any,
            input_ids: Any,
            attention_mask: Any,
            logits_to_keep: int,
            batch_size: int | None = None,
            compute_entropy: bool = False,
            compute_aux_loss: bool = False,
            **extra: Any,
        ) -> Any:
            mask = (
                None
                if any(v is not None for v in extra.values())
                else self._mask_for(input_ids.size(0), logits_to_keep)
            )
            if mask is None:
                return super()._get_per_token_logps_and_entropies(
                    model,
                    input_ids,
                    attention_mask,
                    logits_to_keep,
                    batch_size=batch_size,
                    compute_entropy=compute_entropy,
                    compute_aux_loss=compute_aux_loss,
                    **extra,
                )
            import torch

            mask = mask.to(input_ids.device)
            batch_size = batch_size or input_ids.size(0)
            logps, entropies, aux = [], [], []
            for start in range(0, input_ids.size(0), batch_size):
                ids = input_ids[start : start + batch_size]
                att = attention_mask[start : start + batch_size]
                labels = ids.masked_fill(att == 0, -100)
                labels[:, :-logits_to_keep] = -100
                tail = labels[:, -logits_to_keep:]
                labels[:, -logits_to_keep:] = tail.masked_fill(
                    mask[start : start + batch_size] == 0, -100
                )
                inputs = {"input_ids": ids, "attention_mask": att}
                if compute_aux_loss:
                    inputs["output_router_logits"] = True
                with self.accelerator.autocast(), compact_fused_head():
                    out = model(**inputs, labels=labels, fused_lm_head=True)
                logps.append(out.log_probs[:, -logits_to_keep:])
                if compute_entropy:
                    entropies.append(out.entropy[:, -logits_to_keep:])
                if compute_aux_loss:
                    aux.append(out.aux_loss)
            return (
                torch.cat(logps, dim=0),
                torch.cat(entropies, dim=0) if compute_entropy else None,
                torch.stack(aux).mean() if compute_aux_loss else None,
            )

    EnvGRPOTrainer.__module__ = __name__
    return EnvGRPOTrainer


@functools.cache
def stabilized_kl_trainer_class() -> type:
    """``StabilizedKLGRPOTrainer``, built on first use (it subclasses
    :func:`env_grpo_trainer_class`'s trainer)."""
    trl = require_trl()
    check_private_api(trl)

    class StabilizedKLGRPOTrainer(env_grpo_trainer_class()):
        """TRL's ``GRPOTrainer`` with ARENA's stabilised KL estimator in place of k3.

        k3, TRL's (GRPO's) estimator of ``KL(π_θ || π_ref)`` on tokens sampled from π_θ, is
        ``π_ref/π_θ − log(π_ref/π_θ) − 1``. Its ratio ``π_ref/π_θ = exp(log π_ref − log π_θ)``
        grows without bound as π_θ(token) → 0, and with it the gradient: the instability ARENA
        reports (ARENA, "Effective and Transparent RAG: Adaptive-Reward Reinforcement Learning
        for Decision Traceability", arXiv:2505.13258, §3.2).

        The replacement is ARENA's reference [35] (Schulman, "Approximating KL divergence",
        2020): ``k2 = ½ (log π_θ − log π_ref)²``, non-negative, a symmetric, smooth penalty in
        the log-ratio, as §3.2 describes it (the formula itself is not legible in the paper's
        text; k2 is the one of Schulman's estimators with those properties). It has no
        exponential: it stays finite whenever both log-probabilities are finite, and its
        gradient ``(log π_θ − log π_ref)`` grows only linearly in the log-ratio. It is added with
        the token aggregation of ``loss_type`` (:func:`aggregate`).
        """

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._last_logps = None

        def _get_per_token_logps_and_entropies(self, *args: Any, **kwargs: Any):
            out = super()._get_per_token_logps_and_entropies(*args, **kwargs)
            self._last_logps = out[0]
            return out

        def _compute_loss(self, model: Any, inputs: dict[str, Any]):
            if self.beta == 0.0:
                return super()._compute_loss(model, inputs)
            beta, self.beta = self.beta, 0.0
            try:
                loss = super()._compute_loss(model, inputs)
            finally:
                self.beta = beta
            logps = self._last_logps
            mask = inputs["completion_mask"]
            if "tool_mask" in inputs:  # the rollout's env_mask
                mask = mask * inputs["tool_mask"]
            per_token_kl = 0.5 * (logps - inputs["ref_per_token_logps"]) ** 2
            loss = loss + beta * aggregate(self, per_token_kl, mask, inputs)
            mode = "train" if self.model.training else "eval"
            value = ((per_token_kl * mask).sum() / mask.sum().clamp(min=1.0)).item()
            self._metrics[mode]["kl"].append(value)
            return loss

    StabilizedKLGRPOTrainer.__module__ = __name__
    return StabilizedKLGRPOTrainer


@functools.cache
def token_dpo_trainer_class() -> type:
    """``TokenDPOTrainer``, built on first use (it subclasses ``trl.DPOTrainer``)."""
    trl = require_trl()
    check_private_api(trl)

    class TokenDPOTrainer(trl.DPOTrainer):
        """TRL's ``DPOTrainer`` on rows that are already token ids (``prompt_ids``,
        ``chosen_ids``, ``rejected_ids``, the layout of TRL's own DPO collator): the prompt is
        the exact token context of a rollout (with the env's passages inline), which no chat
        template would reproduce. Rows with ``ref_chosen_logps`` / ``ref_rejected_logps``
        (reference-free: 0) keep them as the reference log-probabilities."""

        def _prepare_dataset(self, dataset, processing_class, args, dataset_name):
            return dataset

        def _precompute_ref_logps(self, dataset, name, batch_size):
            if "ref_chosen_logps" in dataset.column_names:
                return dataset
            return super()._precompute_ref_logps(dataset, name, batch_size)

    TokenDPOTrainer.__module__ = __name__
    return TokenDPOTrainer


def drop_dpo_state(model: Any) -> None:
    """Undo what ``DPOTrainer`` leaves on the PEFT ``model``: its ``"ref"`` adapter (a frozen
    copy of ``"default"``, made when a PEFT model is given without a reference model) and the
    fused LM head it binds to the base model's ``forward`` as an instance attribute
    (``trl.trainer.utils.add_fused_lm_head``). ``"default"`` is the active adapter after."""
    if "ref" in model.peft_config:
        model.delete_adapter("ref")
    model.set_adapter("default")
    vars(model.get_base_model()).pop("forward", None)


def colocated_vllm(trainer: Any) -> Any:
    """The vLLM ``LLM`` of a GRPO ``trainer`` run with ``use_vllm=True, vllm_mode="colocate"``
    (TRL keeps it at ``trainer.vllm_generation.llm``)."""
    llm = getattr(getattr(trainer, "vllm_generation", None), "llm", None)
    if llm is None:
        raise TRLVersionError(
            "expected TRL's colocated vLLM engine at trainer.vllm_generation.llm (use_vllm=True, "
            f"vllm_mode='colocate'), found none; install trl{SUPPORTED}: "
            f"pip install 'trl{SUPPORTED}'"
        )
    return llm

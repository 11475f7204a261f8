"""The policy epoch of EVO-RAG (§3.4 (iii)): one epoch of TRL's DPO on LoRA adapters, over pairs
that are already token ids (the TRL internals it needs are in :mod:`rag_gym.train.trl_compat`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rag_gym.train.evo_rag_dpo.config import EvoRagDPOConfig
from rag_gym.train.trl_compat import checkpointing_option


def _require_trl():
    from rag_gym.train.trl_compat import require_trl

    trl = require_trl()
    import peft

    return trl, peft


def policy_epoch(
    model: Any,
    tokenizer: Any,
    rows: Sequence[dict[str, list[int]]],
    cfg: EvoRagDPOConfig,
    output_dir: str | Path,
    seed: int = 0,
    on_log: Callable[[dict[str, float], int, int], None] | None = None,
) -> list[dict[str, Any]]:
    """One DPO epoch (§3.4 (iii)) of the PEFT ``model`` on ``rows``; returns the trainer's log
    history. ``on_log(logs, step, max_steps)`` sees every logged row."""
    trl, peft = _require_trl()
    import torch
    from datasets import Dataset
    from transformers import PrinterCallback, TrainerCallback

    if not isinstance(model, peft.PeftModel):
        raise TypeError(f"expected a peft.PeftModel (LoRA adapters), got {type(model).__name__}")
    if not rows:
        raise ValueError("expected at least one policy pair, got none")
    columns: dict[str, list[Any]] = {k: [r[k] for r in rows] for k in rows[0]}
    if cfg.reference_free:
        columns["ref_chosen_logps"] = [0.0] * len(rows)
        columns["ref_rejected_logps"] = [0.0] * len(rows)
    cuda = torch.cuda.is_available()
    args = trl.DPOConfig(
        output_dir=str(output_dir),
        per_device_train_batch_size=cfg.per_device_batch_size,
        gradient_accumulation_steps=cfg.gradient_accumulation_steps,
        learning_rate=cfg.learning_rate,
        beta=cfg.beta,
        num_train_epochs=1,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        max_length=None,
        precompute_ref_log_probs=cfg.reference_free,
        **checkpointing_option(trl.DPOConfig, cfg.gradient_checkpointing),
        use_cpu=not cuda,
        bf16=cuda,
        seed=seed,
        disable_tqdm=True,
    )

    class Forward(TrainerCallback):
        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if on_log is not None and logs:
                on_log(dict(logs), int(state.global_step), int(state.max_steps))

    from rag_gym.train.trl_compat import drop_dpo_state, token_dpo_trainer_class

    trainer = token_dpo_trainer_class()(
        model=model,
        args=args,
        train_dataset=Dataset.from_dict(columns),
        processing_class=tokenizer,
        callbacks=[Forward()],
    )
    trainer.remove_callback(PrinterCallback)  # the rows go to on_log, not to stdout
    try:
        trainer.train()
    finally:
        drop_dpo_state(model)  # so the next epoch starts from the same model
    return list(trainer.state.log_history)

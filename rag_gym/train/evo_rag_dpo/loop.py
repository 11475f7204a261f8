"""EVO-RAG's training loop (Algorithm 1): cycles of roll-out, branching, preference-model epoch,
policy epoch and dev check, over the Discovery then the Refinement stage."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rag_gym.rewards.core import EVO_RAG_TERMS
from rag_gym.train.episodes import evaluate_policy, rollout_engine
from rag_gym.train.evo_rag_dpo.branching import SiblingBrancher, env_copies
from rag_gym.train.evo_rag_dpo.config import STAGES, EvoRagDPOConfig
from rag_gym.train.evo_rag_dpo.dpo import _require_trl, policy_epoch
from rag_gym.train.evo_rag_dpo.preference import PreferenceModel, policy_pairs, reward_model_pairs
from rag_gym.train.evo_rag_dpo.tracking import _dpo_logger, _mean, _Tracker
from rag_gym.train.rollout import make_generator
from rag_gym.train.rollout_log import RolloutLog


def _load_adapter(model: Any, folder: Path) -> None:
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    set_peft_model_state_dict(model, load_file(str(folder / "adapter_model.safetensors")))


def train(
    cfg: EvoRagDPOConfig,
    model: Any = None,
    tokenizer: Any = None,
    on_cycle: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run EVO-RAG's two stages (Algorithm 1) and return the run's record.

    ``model``/``tokenizer`` default to :func:`~rag_gym.train.models.load_policy` of
    ``cfg.model``; the model gets LoRA adapters (a PEFT model is used as is). ``on_cycle``
    sees each cycle's summary row. Writes to the run folder: ``config.json``, each cycle's
    adapter and preference heads (``<stage>/cycle<n>/``), ``final/`` (the best Refinement
    adapter and the tokenizer), TensorBoard logs (W&B with ``track``), ``learning_curve.png``
    and ``history.json``.

    Returns ``{"run_dir", "history", "stages": {stage: {best_cycle, best, cycles, checkpoint}},
    "final", "generation", "model"}`` (``generation``: the roll-outs' backend as its
    :meth:`~rag_gym.generation.transformers_lm.TransformersLM.describe` records it; ``model``:
    the PEFT policy, holding the final adapter).
    """
    _, peft = _require_trl()
    import torch

    from rag_gym._names import run_name
    from rag_gym.train.models import load_policy
    from rag_gym.train.tracking import learning_curve

    torch.manual_seed(cfg.seed)
    if model is None:
        model, tokenizer = load_policy(cfg.model)
    if tokenizer is None:
        raise TypeError("a model was given without its tokenizer")
    if not isinstance(model, peft.PeftModel):
        model = peft.get_peft_model(
            model,
            peft.LoraConfig(
                r=cfg.lora_r,
                lora_alpha=cfg.lora_alpha,
                target_modules="all-linear",
                task_type="CAUSAL_LM",
            ),
        )
    name = run_name(cfg.env_id, cfg.exp_name, cfg.seed)
    run_dir = Path(cfg.run_dir or Path(cfg.output_dir) / name)
    run_dir.mkdir(parents=True, exist_ok=True)
    # the tag preset is the method's (text_env), recorded so that ``search_r1:<cycle folder>``
    # plays the adapter with the prompt it was trained on
    record = {**asdict(cfg), "tags": cfg.text_env().tags}
    (run_dir / "config.json").write_text(json.dumps(record, indent=2, default=str))

    brancher = SiblingBrancher(
        rollout_engine(cfg, tokenizer, cfg.split),
        cfg.sibling_actions,
        cfg.max_branch_states,
        batch_size=cfg.batch_size,
        seed=cfg.seed,
    )
    dev = rollout_engine(cfg, tokenizer, cfg.eval_split)
    reward_model = PreferenceModel(cfg.encoder, learning_rate=cfg.rm_learning_rate, seed=cfg.seed)
    tracker = _Tracker(run_dir, cfg.track, name, asdict(cfg))
    rollout_log = RolloutLog(run_dir, every=0, seed=cfg.seed)  # a sample of each cycle's episodes
    order = random.Random(cfg.seed)
    queue: list[int] = []
    n_train = brancher.engine.n_questions
    generation: dict[str, Any] | None = None
    policy_step = 0
    cycle_no = 0
    stages: dict[str, Any] = {}
    try:
        for stage_no, stage in enumerate(STAGES):
            brancher.set_stage(stage)
            env_copies(dev, len(dev.envs), stage)
            buffer: list[tuple[str, str]] = []
            best: tuple[float, float] | None = None
            best_cycle, stall, cycles = 0, 0, 0
            for cycle in range(1, cfg.cycles_per_stage + 1):
                cycles, cycle_no = cycle, cycle_no + 1
                generate = make_generator(
                    model,
                    tokenizer,
                    temperature=cfg.temperature,
                    top_p=cfg.top_p,
                    batch_size=cfg.batch_size,
                )
                generation = generate.lm.describe()
                indices = []
                for _ in range(cfg.episodes_per_cycle):
                    if not queue:
                        queue = list(range(n_train))
                        order.shuffle(queue)
                    indices.append(queue.pop())
                episodes = brancher.rollout(generate, indices)
                rollout_log(cycle_no, episodes, force=True)
                states = brancher.branch(generate, episodes)
                new_pairs = reward_model_pairs(states, cfg.rm_margin)
                unseen = reward_model.evaluate(new_pairs)  # before it trains on them
                buffer += new_pairs
                rm_loss = (
                    reward_model.train_epoch(buffer, cfg.rm_batch_size, seed=cfg.seed + cycle_no)
                    if buffer
                    else float("nan")
                )
                rows = policy_pairs(states, reward_model, cfg.policy_margin)
                dpo_losses: list[float] = []
                if rows:
                    log = policy_epoch(
                        model,
                        tokenizer,
                        rows,
                        cfg,
                        run_dir / "dpo",
                        seed=cfg.seed + cycle_no,
                        on_log=_dpo_logger(tracker, policy_step, stage, cycle_no, dpo_losses),
                    )
                    policy_step += max((r.get("step", 0) for r in log), default=0)
                dev_scores = evaluate_policy(
                    model, tokenizer, dev, cfg.eval_questions, cfg.batch_size, stage
                )
                folder = run_dir / stage / f"cycle{cycle}"
                model.save_pretrained(str(folder))
                reward_model.save(folder / "preference_model.safetensors")
                score = (dev_scores["em"], dev_scores["return"])
                if best is None or score > best:
                    best, best_cycle, stall = score, cycle, 0
                else:
                    stall += 1
                summary = {
                    "charts/stage": float(stage_no),
                    "charts/episode_return": _mean(e.episode_return for e in episodes),
                    "charts/em": _mean(e.em for e in episodes),
                    "charts/num_searches": _mean(e.num_searches for e in episodes),
                    "charts/turns": _mean(e.turns for e in episodes),
                    "charts/states": float(len(states)),
                    "charts/branches": float(sum(len(s.siblings) for s in states)),
                    "charts/rm_pairs": float(len(new_pairs)),
                    "charts/rm_buffer": float(len(buffer)),
                    "charts/policy_pairs": float(len(rows)),
                    "charts/policy_steps": float(policy_step),
                    "losses/reward_model": rm_loss,
                    "eval/rm_accuracy_new_pairs": unseen["accuracy"],
                    "eval/em": dev_scores["em"],
                    "eval/return": dev_scores["return"],
                    "eval/num_searches": dev_scores["num_searches"],
                }
                if dpo_losses:
                    summary["losses/dpo_epoch"] = _mean(dpo_losses)
                for term in EVO_RAG_TERMS:
                    summary[f"rewards/{term}"] = _mean(
                        e.reward_terms.get(term, 0.0) for e in episodes
                    )
                tracker.log(summary, cycle_no, stage=stage, cycle=cycle_no, stage_cycle=cycle)
                if on_cycle is not None:
                    on_cycle({"stage": stage, "cycle": cycle, **summary})
                if stall >= cfg.patience:
                    break
            best_folder = run_dir / stage / f"cycle{best_cycle}"
            _load_adapter(model, best_folder)  # §3.5: reload the stage's best checkpoint
            stages[stage] = {
                "best_cycle": best_cycle,
                "best": {"em": best[0], "return": best[1]} if best else None,
                "cycles": cycles,
                "checkpoint": str(best_folder),
            }
    finally:
        tracker.close()
    final = run_dir / "final"
    model.save_pretrained(str(final))
    tokenizer.save_pretrained(str(final))
    learning_curve(
        tracker.rows,
        run_dir / "learning_curve.png",
        ["losses/dpo", "losses/reward_model", "charts/episode_return", "eval/em"],
        title=run_dir.name,
        x_key="cycle",
    )
    (run_dir / "history.json").write_text(json.dumps(tracker.rows, indent=1, default=str))
    return {
        "run_dir": str(run_dir),
        "history": tracker.rows,
        "stages": stages,
        "final": str(final),
        "generation": generation,
        "model": model,
    }

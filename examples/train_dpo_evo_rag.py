"""EVO-RAG's preference training: sibling branches, a multi-head preference model and DPO on
LoRA adapters, Discovery stage then Refinement stage (``000-evo-rag.txt`` §3.3–3.5).

Each cycle rolls out episodes in the ``evo_rag`` env (SEARCH / BACKTRACK / ANSWER / REFUSE),
branches the other action types at visited states and completes them with the policy, keeps
sibling pairs whose time-weighted returns differ by ≥ 0.3 for the preference model (one epoch),
takes one pair per state whose preference scores differ by ≥ 0.2 for DPO (one epoch, β = 0.1),
and checks dev EM; the best Discovery checkpoint starts the Refinement stage. EM on held-out
test questions is reported before and after. See :mod:`rag_gym.train.evo_rag_dpo`.

CPU, about 30 minutes on 2 cores (the embedded SmolLM2-135M, small budgets; shows the loop,
not learning; ``docs/evo_rag_dpo.md`` has what it printed)::

    OMP_NUM_THREADS=1 python examples/train_dpo_evo_rag.py

GPU, the paper's optimisation settings (effective batch 64, learning rate 5e-6, T_max = 20)::

    python examples/train_dpo_evo_rag.py --episodes-per-cycle 64 --max-episode-steps 20 \\
        --max-branch-states 0 --cycles-per-stage 10 --per-device-batch-size 8 \\
        --gradient-accumulation-steps 8 --learning-rate 5e-6 --eval-questions 200 \\
        --max-turn-tokens 128 --max-completion-tokens 4096 --track

Needs ``pip install torch==2.13.0 'rag-gym[train,dense,hf,llama]'`` (and ``'rag-gym[track]'``
for ``--track``). Writes ``runs/<run name>/``: ``config.json``, each cycle's adapter and
preference heads, ``final/``, TensorBoard logs (W&B offline with ``--track``),
``learning_curve.png``, ``history.json`` and ``results.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Args:
    exp_name: str = "train_dpo_evo_rag"
    """the name of this experiment (part of the run name)"""
    env_id: str = "rag_gym/SynthHop-v0"
    """a rag-gym search env id"""
    model: str = "embedded"
    """embedded (SmolLM2-135M-Instruct) | tiny | a hub id or directory"""
    seed: int = 1
    """seed of sampling, question order, the preference model and the trainers"""
    episodes_per_cycle: int = 6
    """N: episodes rolled out per cycle"""
    max_episode_steps: int = 3
    """T_max of the time-dynamic weights (the paper: 20)"""
    max_branch_states: int = 2
    """visited states branched per episode (0: all, as the paper)"""
    cycles_per_stage: int = 2
    """cycles per stage at most (a stage also stops when dev EM stalls for two cycles)"""
    per_device_batch_size: int = 4
    """policy pairs per forward pass (the paper: 8)"""
    gradient_accumulation_steps: int = 1
    """the paper: 8 (effective batch 64)"""
    learning_rate: float = 5e-5
    """LoRA learning rate (the paper: 5e-6)"""
    rm_learning_rate: float = 1e-2
    """the preference model's (Adam) learning rate"""
    rm_batch_size: int = 16
    """pairs per preference-model update"""
    reference_free: bool = True
    """§3.4's loss as printed (no reference model); --no-reference-free for standard DPO"""
    eval_questions: int = 8
    """dev questions of each cycle's check (greedy)"""
    test_questions: int = 8
    """test questions scored before and after training (greedy)"""
    max_turn_tokens: int = 32
    """new tokens per turn at most"""
    max_completion_tokens: int = 1536
    """model + env tokens per episode at most"""
    temperature: float = 1.0
    """sampling temperature of roll-outs and branches"""
    n_passages: int = 2000
    """SynthHop world size (small: fast index build)"""
    output_dir: str = "runs"
    """parent folder of the run folder"""
    track: bool = False
    """log to W&B (offline unless WANDB_MODE says otherwise)"""


def parse() -> Args:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for f in dataclasses.fields(Args):
        flag = f"--{f.name.replace('_', '-')}"
        if f.type == "bool":
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default)
        else:
            kind = {"int": int, "float": float}.get(f.type, str)
            parser.add_argument(flag, type=kind, default=f.default)
    return Args(**vars(parser.parse_args()))


def main() -> None:
    args = parse()
    from rag_gym.train.evo_rag_dpo import (
        EvoRagDPOConfig,
        evaluate_policy,
        rollout_engine,
        train,
    )
    from rag_gym.train.models import load_policy
    from rag_gym.train.tracking import run_name

    world = {"n_passages": args.n_passages, "n_questions": [200, 50, 50]}
    run_dir = Path(args.output_dir) / run_name(args.env_id, args.exp_name, args.seed)
    cfg = EvoRagDPOConfig(
        env_id=args.env_id,
        env_kwargs={"dataset_kwargs": world},
        model=args.model,
        seed=args.seed,
        episodes_per_cycle=args.episodes_per_cycle,
        max_episode_steps=args.max_episode_steps,
        max_branch_states=args.max_branch_states or None,
        cycles_per_stage=args.cycles_per_stage,
        per_device_batch_size=args.per_device_batch_size,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        learning_rate=args.learning_rate,
        rm_learning_rate=args.rm_learning_rate,
        rm_batch_size=args.rm_batch_size,
        reference_free=args.reference_free,
        eval_questions=args.eval_questions,
        max_turn_tokens=args.max_turn_tokens,
        max_completion_tokens=args.max_completion_tokens,
        temperature=args.temperature,
        exp_name=args.exp_name,
        track=args.track,
        run_dir=str(run_dir),
    )
    model, tokenizer = load_policy(args.model)
    test = rollout_engine(cfg, tokenizer, "test")

    started = time.time()
    # scored under the Refinement weights: the objective the curriculum ends on
    before = evaluate_policy(model, tokenizer, test, args.test_questions, stage="refinement")
    print(f"before: {before}", flush=True)

    def report(row: dict) -> None:
        print(
            f"{row['stage']:>10} cycle {row['cycle']}: branches {row['charts/branches']:.0f} "
            f"at {row['charts/states']:.0f} states, pairs rm {row['charts/rm_pairs']:.0f} / "
            f"policy {row['charts/policy_pairs']:.0f}, loss rm {row['losses/reward_model']:.3f}"
            f" dpo {row.get('losses/dpo_epoch', float('nan')):.3f}, return "
            f"{row['charts/episode_return']:+.3f}, dev EM {row['eval/em']:.3f} "
            f"({time.time() - started:.0f} s)",
            flush=True,
        )

    out = train(cfg, model, tokenizer, on_cycle=report)
    after = evaluate_policy(out["model"], tokenizer, test, args.test_questions, stage="refinement")
    print(f"after:  {after}", flush=True)
    results = {
        "args": dataclasses.asdict(args),
        "before": before,
        "after": after,
        "stages": out["stages"],
        "seconds": round(time.time() - started, 1),
    }
    (run_dir / "results.json").write_text(json.dumps(results, indent=2))
    for stage, best in out["stages"].items():
        print(f"{stage}: best cycle {best['best_cycle']} of {best['cycles']} (dev {best['best']})")
    print(
        f"test EM {before['em']:.3f} -> {after['em']:.3f}; searches/episode "
        f"{before['num_searches']:.2f} -> {after['num_searches']:.2f}"
    )
    print(f"wrote {run_dir}/results.json and {run_dir}/learning_curve.png")


if __name__ == "__main__":
    main()

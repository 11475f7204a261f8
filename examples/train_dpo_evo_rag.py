"""EVO-RAG's preference training: sibling branches, a multi-head preference model and DPO on
LoRA adapters, Discovery stage then Refinement stage (EVO-RAG, "Curriculum-Guided Reinforcement
Learning for Efficient Multi-Hop Retrieval-Augmented Generation", arXiv:2505.17391, §3.3–3.5).

Each cycle rolls out episodes in the ``evo_rag`` env (SEARCH / BACKTRACK / ANSWER / REFUSE),
branches the other action types at visited states and completes them with the policy, keeps
sibling pairs whose time-weighted returns differ by ≥ 0.3 for the preference model (one epoch),
takes one pair per state whose preference scores differ by ≥ 0.2 for DPO (one epoch, β = 0.1),
and checks dev EM; the best Discovery checkpoint starts the Refinement stage. EM on held-out
test questions is reported before and after. See :mod:`rag_gym.train.evo_rag_dpo`.

CPU, about 30 minutes on 2 cores (the embedded SmolLM2-135M, small budgets; shows the loop,
not learning; ``docs/evo_rag_dpo.md`` has what it printed)::

    OMP_NUM_THREADS=1 python examples/train_dpo_evo_rag.py

GPU, the paper's optimisation settings (effective batch 64, learning rate 5e-6, T_max = 20,
every visited state branched), from a YAML file of :class:`~rag_gym.train.evo_rag_dpo.EvoRagDPOConfig`
fields (TRL's ``TrlParser``: ``--config``; options on the command line win over it)::

    # paper.yaml
    episodes_per_cycle: 64
    max_episode_steps: 20
    max_branch_states: null
    cycles_per_stage: 10
    per_device_batch_size: 8
    gradient_accumulation_steps: 8
    learning_rate: 5.0e-6
    eval_questions: 200
    max_turn_tokens: 128
    max_completion_tokens: 4096

    python examples/train_dpo_evo_rag.py --config paper.yaml --test_questions 200 --track

Every field of :class:`~rag_gym.train.evo_rag_dpo.EvoRagDPOConfig` is an option (``--help``);
:data:`SMALL` holds this example's CPU budget.

Needs ``pip install torch==2.13.0 'rag-gym[train,dense,hf,llama]'`` (and ``'rag-gym[track]'``
for ``--track``). Writes ``runs/<run name>/``: ``config.json``, each cycle's adapter and
preference heads, ``final/``, TensorBoard logs (W&B offline with ``--track``),
``learning_curve.png``, ``history.json`` and ``results.json``.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass

#: this example's CPU budget (the embedded SmolLM2-135M, a small SynthHop world)
SMALL = {
    "env_kwargs": {"dataset_kwargs": {"n_passages": 2000, "n_questions": [200, 50, 50]}},
    "exp_name": "train_dpo_evo_rag",
    "seed": 1,
    "episodes_per_cycle": 6,
    "max_episode_steps": 3,
    "max_branch_states": 2,
    "cycles_per_stage": 2,
    "per_device_batch_size": 4,
    "gradient_accumulation_steps": 1,
    "learning_rate": 5e-5,
    "eval_questions": 8,
    "max_turn_tokens": 32,
    "max_completion_tokens": 1536,
}


@dataclass
class ScriptArguments:
    """What this script adds to :class:`~rag_gym.train.evo_rag_dpo.EvoRagDPOConfig`."""

    test_questions: int = 8
    """test questions scored (greedy) before and after training"""


def parse():
    from trl import TrlParser

    from rag_gym.train.evo_rag_dpo import EvoRagDPOConfig

    parser = TrlParser((ScriptArguments, EvoRagDPOConfig))
    parser.set_defaults(**SMALL)
    return parser.parse_args_and_config()


def main() -> None:
    script, cfg = parse()
    from pathlib import Path

    from rag_gym.train.evo_rag_dpo import evaluate_policy, rollout_engine, train
    from rag_gym.train.models import load_policy
    from rag_gym.train.tracking import run_dir_for

    cfg.run_dir = str(run_dir_for(cfg))
    model, tokenizer = load_policy(cfg.model)
    test = rollout_engine(cfg, tokenizer, "test")

    started = time.time()
    # scored under the Refinement weights: the objective the curriculum ends on
    before = evaluate_policy(model, tokenizer, test, script.test_questions, stage="refinement")
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
    after = evaluate_policy(
        out["model"], tokenizer, test, script.test_questions, stage="refinement"
    )
    print(f"after:  {after}", flush=True)
    results = {
        "script": asdict(script),
        "config": asdict(cfg),
        "before": before,
        "after": after,
        "stages": out["stages"],
        "generation": out["generation"],
        "seconds": round(time.time() - started, 1),
    }
    run_dir = Path(cfg.run_dir)
    (run_dir / "results.json").write_text(json.dumps(results, indent=2, default=str))
    for stage, best in out["stages"].items():
        print(f"{stage}: best cycle {best['best_cycle']} of {best['cycles']} (dev {best['best']})")
    print(
        f"test EM {before['em']:.3f} -> {after['em']:.3f}; searches/episode "
        f"{before['num_searches']:.2f} -> {after['num_searches']:.2f}"
    )
    print(f"wrote {run_dir}/results.json and {run_dir}/learning_curve.png")


if __name__ == "__main__":
    main()

"""Train PPO (Stable-Baselines3) on SynthHop with macro actions and hashed observations, and
compare it with every fixed macro heuristic on held-out questions.

    nice -n 10 python examples/train_sb3_ppo.py --seed 1

Needs ``pip install torch==2.13.0 'rag-gym[sb3]'`` (and ``'rag-gym[track]'`` for ``--track``);
runs on a CPU, offline. The env is ``make_sb3_env(env_id)`` from :mod:`rag_gym.train.sb3`:
``MacroActions`` (14 discrete macros: search the question, search candidate j of the focus
passage, answer candidate j, answer the earliest, backtrack, refuse) and ``TextToVector``
(890 floats); the reward is the env's own EM at the answer (minus ``--step-cost`` per step).

1. Every fixed macro heuristic (``SEARCH_QUESTION``, up to ``--max-searches`` candidate
   searches, one answer macro: 217 sequences) plays every validation and every test question;
   the best on validation is *the* heuristic, the best on test an optimistic bound.
2. PPO learns on the train split; every ``--eval-every`` steps it plays ``--eval-questions``
   validation questions (deterministic), the learning curve.
3. PPO plays every test question. The table, ``results.json``, the TensorBoard logs
   (``charts/``, ``losses/``, ``eval/``) and ``learning_curve.png`` go to
   ``runs/<run name>/``; with ``--track``, W&B logs there too (offline unless ``WANDB_MODE``
   says otherwise).
"""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path

import numpy as np
import torch

import rag_gym  # noqa: F401  (registers the envs)
from rag_gym.train.options import parse_config
from rag_gym.train.sb3 import (
    PPOMacroConfig,
    episode_stats_callback,
    eval_callback,
    fixed_sequences,
    macros_of,
    make_logger,
    make_sb3_env,
    model_policy,
    play_split,
    question_kind,
    rank_fixed_sequences,
    require_sb3,
    sequence_policy,
)

args = parse_config(PPOMacroConfig, description=__doc__.split("\n\n")[0])
require_sb3()
from stable_baselines3 import PPO  # noqa: E402  (after the check that names the extra)
from stable_baselines3.common.env_util import make_vec_env  # noqa: E402

run_name = f"{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}"
run_dir = Path(args.runs_dir) / run_name.replace("/", "_")
run_dir.mkdir(parents=True, exist_ok=True)
if args.track:
    import wandb

    wandb.init(
        project=args.wandb_project_name,
        name=run_name,
        dir=str(run_dir),
        mode=os.environ.get("WANDB_MODE", "offline"),
        sync_tensorboard=True,
        config=vars(args),
        save_code=True,
    )
random.seed(args.seed)
np.random.seed(args.seed)
torch.manual_seed(args.seed)
torch.set_num_threads(args.torch_threads)


def make(split: str):
    return make_sb3_env(
        args.env_id,
        split=split,
        encoder=args.encoder,
        n_features=args.n_features,
        step_cost=args.step_cost,
        dataset_kwargs=json.loads(args.dataset_kwargs),
    )


val_env, test_env = make("validation"), make("test")
n_heur = args.heuristic_questions or None

# 1. every fixed macro heuristic, on validation (to choose) and on test (to report)
t0 = time.time()
sequences = fixed_sequences(max_searches=args.max_searches)
on_val = rank_fixed_sequences(val_env, sequences, n_heur)
on_test = dict(rank_fixed_sequences(test_env, sequences, n_heur))
best_seq, best_val = on_val[0]
best_test_seq = max(on_test, key=lambda s: (on_test[s]["em"], on_test[s]["return"]))
print(f"{len(sequences)} fixed heuristics scored in {time.time() - t0:.0f}s")
for seq, stats in on_val[:5]:
    print(f"  val EM {stats['em']:.3f}  test EM {on_test[seq]['em']:.3f}  {' > '.join(seq)}")

# 2. PPO on the train split, evaluated on validation questions as it learns
envs = make_vec_env(lambda: make("train"), n_envs=args.num_envs, seed=args.seed)
model = PPO(
    "MlpPolicy",
    envs,
    learning_rate=args.learning_rate,
    n_steps=args.num_steps,
    batch_size=args.batch_size,
    n_epochs=args.update_epochs,
    gamma=args.gamma,
    gae_lambda=args.gae_lambda,
    ent_coef=args.ent_coef,
    policy_kwargs={"net_arch": [args.hidden, args.hidden]},
    seed=args.seed,
    device="cpu",
)
model.set_logger(make_logger(str(run_dir), ["tensorboard", "csv"]))
evaluator = eval_callback(val_env, every=args.eval_every, n_questions=args.eval_questions or None)
t0 = time.time()
model.learn(args.total_timesteps, callback=[evaluator, episode_stats_callback()])
train_seconds = time.time() - t0
for steps, stats in evaluator.history:
    print(f"  step {steps:7d}  validation EM {stats['em']:.3f}  steps {stats['steps']:.2f}")

# 3. PPO on every test question (and EM per question kind, beside the chosen heuristic's)
ppo_test = play_split(test_env, model_policy(model), group_by=question_kind)
heuristic_test = play_split(
    macros_of(test_env), sequence_policy(test_env, best_seq), group_by=question_kind
)
ppo_val = play_split(val_env, model_policy(model), n_heur)
for key, value in ppo_test.items():
    model.logger.record(f"eval/test_{key}", value)
model.logger.dump(model.num_timesteps)
model.save(run_dir / "ppo")

rows = [
    ("PPO (learned)", ppo_val, ppo_test),
    (f"best fixed heuristic on validation: {' > '.join(best_seq)}", best_val, on_test[best_seq]),
    (
        f"best fixed heuristic on test (optimistic): {' > '.join(best_test_seq)}",
        dict(next(s for q, s in on_val if q == best_test_seq)),
        on_test[best_test_seq],
    ),
]
table = ["| policy | validation EM | test EM | test return | test steps |", "|---|---|---|---|---|"]
for name, val, test in rows:
    table.append(
        f"| {name} | {val['em']:.3f} | {test['em']:.3f} | {test['return']:.3f} | {test['steps']:.2f} |"
    )
print("\n".join(table))
kinds = [k[len("em/") :] for k in ppo_test if k.startswith("em/")]
print("\n| question kind (test) | n | PPO EM | heuristic EM |\n|---|---|---|---|")
for kind in kinds:
    print(
        f"| {kind} | {ppo_test[f'n/{kind}']} | {ppo_test[f'em/{kind}']:.2f} "
        f"| {heuristic_test[f'em/{kind}']:.2f} |"
    )
results = {
    "run_name": run_name,
    "args": vars(args),
    "train_seconds": train_seconds,
    "ppo": {"validation": ppo_val, "test": ppo_test},
    "heuristic": {"sequence": list(best_seq), "test": heuristic_test},
    "curve": [{"timesteps": s, **stats} for s, stats in evaluator.history],
    "heuristics": [
        {"sequence": list(seq), "validation": stats, "test": on_test[seq]} for seq, stats in on_val
    ],
}
(run_dir / "results.json").write_text(json.dumps(results, indent=2) + "\n")

# the learning curve, written at the end of every run
import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

fig, ax = plt.subplots(figsize=(6.4, 4))
xs = [s for s, _ in evaluator.history]
ax.plot(xs, [st["em"] for _, st in evaluator.history], marker="o", label="PPO (validation)")
ax.axhline(best_val["em"], color="grey", ls="--", label="best fixed heuristic (validation)")
ax.scatter(
    [xs[-1]], [ppo_test["em"]], color="C1", zorder=3, label=f"PPO test EM {ppo_test['em']:.3f}"
)
ax.axhline(
    on_test[best_seq]["em"],
    color="C1",
    ls=":",
    label=f"heuristic test EM {on_test[best_seq]['em']:.3f}",
)
ax.set_xlabel("environment steps")
ax.set_ylabel("EM")
ax.set_ylim(0, 1)
ax.set_title(f"PPO on {args.env_id}, seed {args.seed}")
ax.legend(loc="center right", fontsize=8)
fig.tight_layout()
fig.savefig(run_dir / "learning_curve.png", dpi=100)
plt.close(fig)
print(f"run folder: {run_dir}")
if args.track:
    wandb.finish()

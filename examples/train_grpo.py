"""GRPO (or DAPO) with multi-turn search episodes: a policy learns to search and answer.

Plays whole episodes in a rag_gym env (generate until ``</search>``, retrieve, append the
passages, go on until ``<answer>``), trains on the episode return under a paper's recipe, and
reports EM on held-out validation questions before and after, with the learning curve.

CPU (the embedded SmolLM2-135M, small budgets; shows the loop, not learning)::

    OMP_NUM_THREADS=2 python examples/train_grpo.py --max_steps 4 --eval_n 8

It plays 8 greedy validation episodes, trains 4 GRPO steps of 4 episodes each, then plays the 8
validation episodes again. On 2 cores a GRPO step takes 30 to 80 seconds and an evaluation
episode 3 to 8 (docs/training.md), so the run takes about 5 to 10 minutes, more on a loaded
machine. It says when each evaluation starts and ends (with its EM and time); TRL shows the
steps' progress.

GPU (what the docs report; add ``--use-vllm`` with ``rag-gym[gpu]``)::

    python examples/train_grpo.py --recipe eval_rar --max_steps 200 --prompts_per_step 8 \\
        --eval_n 200 --track
    python examples/train_grpo.py --recipe eval_rar --max_steps 200 --prompts_per_step 8 \\
        --eval_n 200 --step_cost 0.05 --exp_name step_cost      # fewer searches per episode

Every field of :class:`rag_gym.train.grpo.EnvGRPOConfig` is an option (``--help`` lists them;
dict fields take JSON, e.g. ``--env_kwargs '{"k": 5}'``; ``--config run.yaml`` reads them from
a file, TRL's ``TrlParser``). ``--recipe`` sets a paper's settings first
(:data:`rag_gym.train.recipes.RECIPES`); :data:`SMALL` then sets this example's CPU budget;
options on the command line win over both.

Writes ``runs/<run name>/``: ``config.json``, checkpoints, TensorBoard logs (W&B offline with
``--track``), ``learning_curve.png``, ``final/`` and ``results.json`` (validation EM before and
after, :func:`rag_gym.train.grpo.train_from`).
"""

from __future__ import annotations

from dataclasses import dataclass

#: this example's CPU budget (the embedded SmolLM2-135M, a small SynthHop world)
SMALL = {
    "env_kwargs": {"dataset_kwargs": {"n_passages": 2000, "n_questions": [200, 50, 50]}},
    "exp_name": "train_grpo",
    "seed": 1,
    "max_steps": 4,
    "num_generations": 4,
    "prompts_per_step": 1,
    "learning_rate": 5e-5,
    "max_turns": 4,
    "max_turn_tokens": 48,
    "max_completion_tokens": 768,
    "temperature": 0.8,
}


@dataclass
class ScriptArguments:
    """What this script adds to :class:`~rag_gym.train.grpo.EnvGRPOConfig`."""

    recipe: str = "eval_rar"
    """eval_rar | lwts | arena (r2ag trains with rag_gym.train.recipes.run)"""
    eval_n: int = 8
    """validation questions scored (greedy) before and after training"""


def parse():
    from transformers import HfArgumentParser
    from trl import TrlParser

    from rag_gym.train.grpo import EnvGRPOConfig
    from rag_gym.train.recipes import RECIPES, recipe

    # the recipe decides the defaults, so it is read first
    script, _ = HfArgumentParser(ScriptArguments, add_help=False).parse_args_into_dataclasses(
        return_remaining_strings=True
    )
    recipe(script.recipe)  # an unknown name fails here, with "did you mean"
    settings = RECIPES[script.recipe]
    env_kwargs = {**settings.get("env_kwargs", {}), **SMALL["env_kwargs"]}
    parser = TrlParser((ScriptArguments, EnvGRPOConfig))
    parser.set_defaults(**{**settings, **SMALL, "env_kwargs": env_kwargs})
    return parser.parse_args_and_config()


def main() -> None:
    script, cfg = parse()
    from rag_gym.train.grpo import train_from

    results = train_from(cfg, eval_n=script.eval_n)
    before, after = results["before"], results["after"]
    print(f"before: {before}\nafter:  {after}", flush=True)
    print(
        f"EM {before['em']:.3f} -> {after['em']:.3f}; searches/episode "
        f"{before['num_searches']:.2f} -> {after['num_searches']:.2f}"
    )
    run_dir = results["run_dir"]
    print(f"wrote {run_dir}/results.json and {run_dir}/learning_curve.png")


if __name__ == "__main__":
    main()

"""GRPO (or DAPO) with multi-turn search episodes: a policy learns to search and answer.

Plays whole episodes in a rag_gym env (generate until ``</search>``, retrieve, append the
passages, go on until ``<answer>``), trains on the episode return under a paper's recipe, and
reports EM on held-out validation questions before and after, with the learning curve.

CPU, a few minutes (the embedded SmolLM2-135M, small budgets; shows the loop, not learning)::

    OMP_NUM_THREADS=2 python examples/train_grpo.py --max-steps 4 --eval-n 8

GPU (what the docs report; add ``--use-vllm`` with ``rag-gym[gpu]``)::

    python examples/train_grpo.py --recipe eval_rar --max-steps 200 --prompts-per-step 8 \\
        --eval-n 200 --track
    python examples/train_grpo.py --recipe eval_rar --max-steps 200 --prompts-per-step 8 \\
        --eval-n 200 --step-cost 0.05 --exp-name step_cost      # fewer searches per episode

Writes ``runs/<run name>/``: ``config.json``, checkpoints, TensorBoard logs (W&B offline with
``--track``), ``learning_curve.png`` and ``results.json`` (EM before/after).
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
    recipe: str = "eval_rar"
    """eval_rar | lwts | arena (r2ag trains with rag_gym.train.recipes.run)"""
    env_id: str = "rag_gym/SynthHop-v0"
    """the env to train in (its -Reader-v0 id for arena)"""
    model: str = "embedded"
    """embedded (SmolLM2-135M-Instruct) | tiny | a hub id or directory"""
    exp_name: str = "train_grpo"
    seed: int = 1
    max_steps: int = 4
    num_generations: int = 4
    prompts_per_step: int = 1
    learning_rate: float = 5e-5
    max_turns: int = 4
    max_turn_tokens: int = 48
    max_completion_tokens: int = 768
    temperature: float = 0.8
    step_cost: float = 0.0
    """weight of EVO-RAG's step-cost term (0: off)"""
    lora: bool = True
    eval_n: int = 8
    """validation questions scored (greedy) before and after training"""
    n_passages: int = 2000
    """SynthHop world size (small: fast index build)"""
    output_dir: str = "runs"
    track: bool = False
    use_vllm: bool = False


def parse() -> Args:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for f in dataclasses.fields(Args):
        if f.type == "bool":
            parser.add_argument(
                f"--{f.name.replace('_', '-')}",
                action=argparse.BooleanOptionalAction,
                default=f.default,
            )
        else:
            kind = {"int": int, "float": float}.get(f.type, str)
            parser.add_argument(f"--{f.name.replace('_', '-')}", type=kind, default=f.default)
    return Args(**vars(parser.parse_args()))


def main() -> None:
    args = parse()
    from rag_gym.train.grpo import build_trainer, evaluate_policy, rollout_engine
    from rag_gym.train.models import load_policy
    from rag_gym.train.recipes import recipe
    from rag_gym.train.tracking import run_name

    world = {"n_passages": args.n_passages, "n_questions": [200, 50, 50]}
    run_dir = Path(args.output_dir) / run_name(args.env_id, args.exp_name, args.seed)
    cfg = recipe(
        args.recipe,
        env_id=args.env_id,
        env_kwargs={"dataset_kwargs": world},
        model=args.model,
        seed=args.seed,
        max_steps=args.max_steps,
        num_generations=args.num_generations,
        prompts_per_step=args.prompts_per_step,
        learning_rate=args.learning_rate,
        max_turns=args.max_turns,
        max_turn_tokens=args.max_turn_tokens,
        max_completion_tokens=args.max_completion_tokens,
        temperature=args.temperature,
        step_cost=args.step_cost,
        lora=args.lora,
        track=args.track,
        use_vllm=args.use_vllm,
        exp_name=args.exp_name,
        run_dir=str(run_dir),
    )
    model, tokenizer = load_policy(args.model)

    started = time.time()
    validation = rollout_engine(cfg, tokenizer, "validation")
    before = evaluate_policy(model, tokenizer, validation, n=args.eval_n)
    print(f"before: {before}", flush=True)

    trainer, _ = build_trainer(cfg, model, tokenizer, run_dir=run_dir)
    trainer.train()
    trainer.save_model(str(run_dir / "final"))

    after = evaluate_policy(trainer.model, tokenizer, validation, n=args.eval_n)
    print(f"after:  {after}", flush=True)
    results = {
        "args": dataclasses.asdict(args),
        "before": before,
        "after": after,
        "seconds": round(time.time() - started, 1),
        "train_log": [
            {k: v for k, v in row.items() if not k.startswith("profiling")}
            for row in trainer.state.log_history
        ],
    }
    (run_dir / "results.json").write_text(json.dumps(results, indent=2))
    print(
        f"EM {before['em']:.3f} -> {after['em']:.3f}; searches/episode "
        f"{before['num_searches']:.2f} -> {after['num_searches']:.2f}"
    )
    print(f"wrote {run_dir}/results.json and {run_dir}/learning_curve.png")


if __name__ == "__main__":
    main()

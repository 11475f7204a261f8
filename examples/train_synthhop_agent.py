"""Turn the embedded SmolLM2-135M into a SynthHop search agent: SFT cold start, GRPO, ship it.

The whole pipeline, top to bottom, on a CPU:

1. **SFT** on the scripted expert's transcripts (:mod:`rag_gym.train.sft`): LoRA on every linear
   layer, loss on the model-written tokens only;
2. **GRPO** from that checkpoint (:func:`rag_gym.train.grpo.train_from`), the adapter going on
   training in the same env (skipped with ``--grpo-steps 0``);
3. **ship** the adapter as a checkpoint folder (:func:`rag_gym.train.ship.package_adapter`:
   PEFT weights, the llama.cpp GGUF adapter and a model card);
4. **evaluate** it with ``rag-gym evaluate``'s protocol on the held-out test split through
   llama.cpp, the main command's backend.

What the docs report (2-core CPU; ``OMP_NUM_THREADS=1`` when the machine is shared)::

    python examples/train_synthhop_agent.py --demos 200 --grpo-steps 0 --test-n 200

A quick smoke run (minutes; the tiny random model learns nothing)::

    python examples/train_synthhop_agent.py --model tiny --demos 8 --sft-steps 2 --grpo-steps 2 \\
        --eval-n 4 --test-n 0

Writes ``runs/<run name>/``: ``sft/`` and ``grpo/`` (each with ``config.json``, checkpoints,
``learning_curve.png``, TensorBoard files and ``results.json``), ``checkpoint/`` (the shipped
folder) and ``results.json`` (every stage's held-out figures and wall times).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Args:
    env_id: str = "rag_gym/SynthHop-v0"
    """the SynthHop env to train in"""
    tags: str = "search_r1"
    """the TextActions tag preset"""
    model: str = "embedded"
    """embedded (SmolLM2-135M-Instruct) | tiny (smoke tests)"""
    seed: int = 0
    demos: int = 200
    """expert demonstrations (train split)"""
    sft_lr: float = 1e-3
    sft_steps: int = -1
    """-1: one epoch over the demonstrations"""
    batch_size: int = 8
    grpo_steps: int = 0
    """GRPO steps from the SFT checkpoint (0: skip GRPO)"""
    grpo_lr: float = 2e-5
    num_generations: int = 4
    prompts_per_step: int = 2
    step_cost: float = 0.0
    """EVO-RAG step-cost weight in GRPO (0: off)"""
    eval_n: int = 100
    """validation questions for each stage's EM (choices are made on validation)"""
    test_n: int = 200
    """test questions for the final llama.cpp evaluation (0: skip)"""
    output_dir: str = "runs"
    track: bool = False


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
    from rag_gym.train.grpo import EnvGRPOConfig, train_from
    from rag_gym.train.sft import SFTConfig
    from rag_gym.train.sft import train as train_sft
    from rag_gym.train.ship import package_adapter
    from rag_gym.train.tracking import run_name

    root = Path(args.output_dir) / run_name(args.env_id, "synthhop_agent", args.seed)
    command = "python " + " ".join(shlex.quote(a) for a in sys.argv)
    report: dict = {"args": dataclasses.asdict(args), "command": command, "stages": {}}

    started = time.time()
    sft = train_sft(
        SFTConfig(
            env_id=args.env_id,
            tags=args.tags,
            n_demos=args.demos,
            model=args.model,
            learning_rate=args.sft_lr,
            max_steps=args.sft_steps,
            batch_size=args.batch_size,
            eval_n=args.eval_n,
            seed=args.seed,
            run_dir=str(root / "sft"),
            track=args.track,
        )
    )
    report["stages"]["sft"] = {k: sft[k] for k in ("before", "after", "seconds", "data")}
    print(f"SFT: validation EM {sft['before']} -> {sft['after']}", flush=True)
    final = Path(sft["checkpoint"])

    if args.grpo_steps > 0:
        grpo = train_from(
            EnvGRPOConfig(
                env_id=args.env_id,
                tags=args.tags,
                reward_preset="none",
                model=args.model,
                max_steps=args.grpo_steps,
                num_generations=args.num_generations,
                prompts_per_step=args.prompts_per_step,
                learning_rate=args.grpo_lr,
                beta=0.0,
                step_cost=args.step_cost,
                seed=args.seed,
                run_dir=str(root / "grpo"),
                track=args.track,
            ),
            init=final,
            eval_n=args.eval_n,
        )
        report["stages"]["grpo"] = {k: grpo[k] for k in ("before", "after", "seconds")}
        print(f"GRPO: validation EM {grpo['before']} -> {grpo['after']}", flush=True)
        final = Path(grpo["checkpoint"])

    if args.model != "embedded":
        print("the tiny model has no llama.cpp base: not shipped, not evaluated with llama.cpp")
    else:
        checkpoint = package_adapter(
            final,
            root / "checkpoint",
            {
                "name": f"rag-gym SynthHop search agent ({args.tags})",
                "command": command,
                "seed": args.seed,
                "data": f"{args.demos} expert transcripts of {args.env_id}'s train split",
                "results": [f"{k}: {v['after']}" for k, v in report["stages"].items()],
            },
        )
        print(f"checkpoint: {checkpoint}", flush=True)
        if args.test_n:
            from rag_gym.baselines import make_agent
            from rag_gym.evaluate import EvalConfig, evaluate
            from rag_gym.generation.llama_cpp import LlamaCppLM

            lm = LlamaCppLM()
            result = evaluate(
                EvalConfig(
                    env_id=args.env_id,
                    split="test",
                    n=args.test_n,
                    agents=(f"search_r1:{checkpoint}",),
                    lm_spec="llama_cpp",
                    out_dir=str(root),
                    run_name="test_llama_cpp",
                ),
                lambda name, env: make_agent(name, lm=lm, env=env),
            )
            report["test_llama_cpp"] = result.rows[0]
            print(f"test (llama.cpp): EM {result.rows[0]['em']:.3f}", flush=True)
    report["seconds"] = round(time.time() - started, 1)
    (root / "results.json").write_text(json.dumps(report, indent=2, default=str))
    print(f"wrote {root}/results.json")


if __name__ == "__main__":
    main()

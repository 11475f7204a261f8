"""Turn the embedded SmolLM2-135M into a SynthHop search agent: SFT cold start, GRPO, ship it.

The whole pipeline, top to bottom, on a CPU:

1. **SFT** on the scripted expert's transcripts (:mod:`rag_gym.train.sft`): LoRA on every linear
   layer, loss on the model-written tokens only;
2. **GRPO** from that checkpoint (:func:`rag_gym.train.grpo.train_from`), the adapter going on
   training in the same env (skipped with ``--grpo_steps 0``);
3. **ship** the adapter as a checkpoint folder (:func:`rag_gym.train.ship.package_adapter`:
   PEFT weights, the llama.cpp GGUF adapter and a model card);
4. **evaluate** it with ``rag-gym evaluate``'s protocol on the held-out test split through
   llama.cpp, the main command's backend.

What the docs report (2-core CPU; ``OMP_NUM_THREADS=1`` when the machine is shared)::

    python examples/train_synthhop_agent.py --n_demos 600 --grpo_steps 0 --test_n 200

A quick smoke run (minutes; the tiny random model learns nothing)::

    python examples/train_synthhop_agent.py --model tiny --n_demos 8 --max_steps 2 --grpo_steps 2 \\
        --eval_n 4 --test_n 0

The SFT stage's options are the fields of :class:`rag_gym.train.sft.SFTConfig` (``--help``; TRL's
``TrlParser``, so ``--config run.yaml`` works too); :class:`PipelineArguments` adds the GRPO
stage and the final test, whose env, model and turn limits are the SFT stage's.

Writes ``runs/<run name>/``: ``sft/`` and ``grpo/`` (each with ``config.json``, checkpoints,
``learning_curve.png``, TensorBoard files and ``results.json``), ``checkpoint/`` (the shipped
folder) and ``results.json`` (every stage's held-out figures and wall times).
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass
class PipelineArguments:
    """What the pipeline adds to :class:`~rag_gym.train.sft.SFTConfig`."""

    grpo_steps: int = 0
    """GRPO steps from the SFT checkpoint (0: skip GRPO)"""
    grpo_learning_rate: float = 2e-5
    """GRPO's learning rate"""
    num_generations: int = 4
    """GRPO's group size"""
    prompts_per_step: int = 2
    """GRPO's questions per step"""
    step_cost: float = 0.0
    """EVO-RAG step-cost weight in GRPO (0: off)"""
    test_n: int = 200
    """test questions for the final llama.cpp evaluation (0: skip)"""


def parse():
    from trl import TrlParser

    from rag_gym.train.sft import SFTConfig

    parser = TrlParser((PipelineArguments, SFTConfig))
    parser.set_defaults(exp_name="synthhop_agent")
    return parser.parse_args_and_config()


def main() -> None:
    pipeline, sft_cfg = parse()
    from rag_gym.train.grpo import EnvGRPOConfig, train_from
    from rag_gym.train.sft import train as train_sft
    from rag_gym.train.ship import package_adapter, record_fixed_questions
    from rag_gym.train.tracking import run_dir_for

    root = run_dir_for(sft_cfg)
    command = "python " + " ".join(shlex.quote(a) for a in sys.argv)
    report: dict = {
        "pipeline": dataclasses.asdict(pipeline),
        "sft_config": dataclasses.asdict(sft_cfg),
        "command": command,
        "stages": {},
    }

    started = time.time()
    sft = train_sft(dataclasses.replace(sft_cfg, run_dir=str(root / "sft")))
    report["stages"]["sft"] = {k: sft[k] for k in ("before", "after", "seconds", "data")}
    print(f"SFT: validation EM {sft['before']} -> {sft['after']}", flush=True)
    final = Path(sft["checkpoint"])

    if pipeline.grpo_steps > 0:
        grpo = train_from(
            EnvGRPOConfig(
                env_id=sft_cfg.env_id,
                env_kwargs=sft_cfg.env_kwargs,
                tags=sft_cfg.tags,
                reward_preset="none",
                model=sft_cfg.model,
                max_turns=sft_cfg.max_turns,
                max_turn_tokens=sft_cfg.max_turn_tokens,
                max_completion_tokens=sft_cfg.max_completion_tokens,
                max_steps=pipeline.grpo_steps,
                num_generations=pipeline.num_generations,
                prompts_per_step=pipeline.prompts_per_step,
                learning_rate=pipeline.grpo_learning_rate,
                beta=0.0,
                step_cost=pipeline.step_cost,
                seed=sft_cfg.seed,
                run_dir=str(root / "grpo"),
                track=sft_cfg.track,
            ),
            init=final,
            eval_n=sft_cfg.eval_n,
        )
        report["stages"]["grpo"] = {k: grpo[k] for k in ("before", "after", "seconds")}
        print(f"GRPO: validation EM {grpo['before']} -> {grpo['after']}", flush=True)
        final = Path(grpo["checkpoint"])

    if sft_cfg.model != "embedded":
        print("the tiny model has no llama.cpp base: not shipped, not evaluated with llama.cpp")
    else:
        checkpoint = package_adapter(
            final,
            root / "checkpoint",
            {
                "name": f"rag-gym SynthHop search agent ({sft_cfg.tags})",
                "command": command,
                "seed": sft_cfg.seed,
                "data": f"{sft_cfg.n_demos} expert transcripts of {sft_cfg.env_id}'s train split",
                "results": [f"{k}: {v['after']}" for k, v in report["stages"].items()],
                "env_id": sft_cfg.env_id,
                "tags": sft_cfg.tags,
            },
        )
        # the answers to 8 fixed test questions, which the model card lists and a test replays
        record_fixed_questions(checkpoint)
        print(f"checkpoint: {checkpoint}", flush=True)
        if pipeline.test_n:
            from rag_gym.baselines import make_agent
            from rag_gym.evaluate import EvalConfig, evaluate
            from rag_gym.generation.llama_cpp import LlamaCppLM

            lm = LlamaCppLM()
            result = evaluate(
                EvalConfig(
                    env_id=sft_cfg.env_id,
                    split="test",
                    n=pipeline.test_n,
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

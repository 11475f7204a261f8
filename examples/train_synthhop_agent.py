"""Turn the embedded SmolLM2-135M into a SynthHop search agent: SFT cold start, GRPO, ship it.

The whole pipeline, top to bottom, on a CPU (``rag-gym train pipeline`` is the same run as one
CLI command; both call :func:`rag_gym.train.pipeline.train_and_ship`):

1. **SFT** on the scripted expert's transcripts (:mod:`rag_gym.train.sft`): LoRA on every linear
   layer, loss on the model-written tokens only;
2. **GRPO/DAPO** from that checkpoint (:func:`rag_gym.train.grpo.train_from`), the adapter going
   on training in the same env (skipped with ``--grpo_steps 0``);
3. **ship** the adapter as a checkpoint folder (:func:`rag_gym.train.ship.package_adapter`:
   PEFT weights, the llama.cpp GGUF adapter and a model card);
4. **evaluate** it with ``rag-gym evaluate``'s protocol on the held-out test split through
   llama.cpp, the main command's backend (:func:`rag_gym.evaluate.evaluate_checkpoint`).

The defaults are ``rag-gym train pipeline``'s (docs/training.md): 600 transcripts, then GRPO for
100 steps of two questions and 4 episodes each at lr 5e-5, on a 2-core CPU::

    OMP_NUM_THREADS=2 python examples/train_synthhop_agent.py

A quick smoke run (minutes; the tiny random model learns nothing)::

    python examples/train_synthhop_agent.py --model tiny --n_demos 8 --max_steps 2 --grpo_steps 2 \\
        --eval_n 4 --test_n 0

The SFT stage's options are the fields of :class:`rag_gym.train.sft.SFTConfig` (``--help``; TRL's
``TrlParser``, so ``--config run.yaml`` works too); :class:`rag_gym.train.pipeline.PipelineConfig`
adds the RL stage and the final test, whose env, model and turn limits are the SFT stage's.

Writes ``runs/<run name>/``: ``sft/`` and ``grpo/`` (each with ``config.json``, checkpoints,
``learning_curve.png``, TensorBoard files and ``results.json``), ``checkpoint/`` (the shipped
folder), ``test/`` (the evaluation's run folder) and ``results.json`` (every stage's held-out
figures and wall times).
"""

from __future__ import annotations

import shlex
import sys
import time


def parse():
    from trl import TrlParser

    from rag_gym.train.pipeline import PipelineConfig
    from rag_gym.train.sft import SFTConfig

    parser = TrlParser((PipelineConfig, SFTConfig))
    parser.set_defaults(exp_name="synthhop_agent", n_demos=600, eval_n=0, eval_before=False)
    return parser.parse_args_and_config()


def main() -> None:
    pipeline, sft_cfg = parse()
    from rag_gym.evaluate import evaluate_checkpoint
    from rag_gym.train.pipeline import train_and_ship, write_report
    from rag_gym.train.tracking import run_dir_for

    root = run_dir_for(sft_cfg)
    command = "python " + " ".join(shlex.quote(a) for a in sys.argv)
    started = time.perf_counter()
    report = train_and_ship(sft_cfg, pipeline, root, command)
    if report["checkpoint"] and pipeline.test_n:
        t0 = time.perf_counter()
        row = evaluate_checkpoint(
            report["checkpoint"],
            sft_cfg.env_id,
            pipeline.test_n,
            root,
            "test",
            seed=sft_cfg.seed,
            env_kwargs=sft_cfg.env_kwargs,
        )
        report["test"] = row
        report["seconds"]["test"] = round(time.perf_counter() - t0, 1)
        print(f"test (llama.cpp): EM {row['em']:.3f}", flush=True)
    report["seconds"]["total"] = round(time.perf_counter() - started, 1)
    print(f"wrote {write_report(root, report)}")


if __name__ == "__main__":
    main()

"""Peak memory of GRPO steps with a step's episodes in one forward/backward pass against
passes of one (``micro_batch_size``), on the embedded SmolLM2-135M.

Each setting trains the same steps in a fresh process (same seed, so the same questions and,
for the first step, the same rollouts), and prints its peak RSS, its step times and the tokens
per episode; the last line gives the ratios. The untrained model writes long episodes (it
rarely closes an action tag, so turns run to their token limit), which is the case that needs
the memory.

    OMP_NUM_THREADS=2 python benchmarks/grpo_memory.py              # 4 episodes a step, 2 steps
    python benchmarks/grpo_memory.py --model tiny --steps 1         # a quick check
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def run_one(args: argparse.Namespace, micro: int) -> dict:
    """Train ``args.steps`` steps with ``micro`` episodes a pass, in this process."""
    import time

    from rag_gym.train.grpo import EnvGRPOConfig, build_trainer

    cfg = EnvGRPOConfig(
        model=args.model,
        env_id=args.env,
        tags="search_r1",
        reward_preset="none",
        num_generations=args.num_generations,
        prompts_per_step=1,
        micro_batch_size=micro,
        max_steps=args.steps,
        max_completion_tokens=args.max_completion_tokens,
        learning_rate=1e-5,
        beta=0.04,
        temperature=1.0,
        run_dir=tempfile.mkdtemp(prefix=f"rag_gym_grpo_memory_{micro}_"),
        save_steps=10_000,
    )
    trainer, _ = build_trainer(cfg)
    started = time.perf_counter()
    trainer.train()
    logs = trainer.state.log_history
    with open("/proc/self/status") as f:
        peak = next(int(line.split()[1]) for line in f if line.startswith("VmHWM")) / 1e6
    return {
        "micro": micro,
        "peak_gb": round(peak, 2),
        "step_s": [round(r["step_time"], 1) for r in logs if "step_time" in r],
        "tokens": [
            round(r["episode/completion_tokens"]) for r in logs if "episode/completion_tokens" in r
        ],
        "seconds": round(time.perf_counter() - started, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--env", default="rag_gym/SynthHop-Hard-v0")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--num-generations", type=int, default=4)
    parser.add_argument("--max-completion-tokens", type=int, default=1024)
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # child: one setting
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(run_one(args, args.one)))
        return
    if sys.platform != "linux":
        raise SystemExit("this benchmark reads peak RSS from /proc (Linux only)")
    rows = []
    for micro in (args.num_generations, 1):
        child = [sys.executable, __file__, "--one", str(micro)]
        child += ["--model", args.model, "--env", args.env, "--steps", str(args.steps)]
        child += ["--num-generations", str(args.num_generations)]
        child += ["--max-completion-tokens", str(args.max_completion_tokens)]
        out = subprocess.run(child, check=True, capture_output=True, text=True).stdout
        row = json.loads(out.strip().splitlines()[-1])
        rows.append(row)
        print(
            f"{row['micro']} episode(s) a pass: peak RSS {row['peak_gb']:.2f} GB, "
            f"steps {row['step_s']} s, model + env tokens per episode {row['tokens']}"
        )
    whole, single = rows
    print(
        f"passes of 1 against one pass of {whole['micro']}: peak RSS "
        f"{single['peak_gb'] / whole['peak_gb']:.2f}x, "
        f"time {sum(single['step_s']) / sum(whole['step_s']):.2f}x"
    )


if __name__ == "__main__":
    main()

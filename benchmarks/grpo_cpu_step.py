"""A GRPO step on the CPU and where its time goes, this tree against a git revision from the same
start and with the same config; then rollout-shaped generation on the torch engine against
llama.cpp.

Part 1 trains ``--steps`` steps (after one warm-up step) from the run's adapter and seed, in a
fresh process, and prints the mean seconds a step spends in the rollout, the reference's pass,
the policy's forward passes and their backward. With ``--against REV`` it trains again with git
revision ``REV``'s ``rag_gym`` (same start, seed and config, so the same rollouts) and prints the
ratio of the step times: ``--against ee83f91~1`` is TRL's own computation of the
log-probabilities at every token, before the trainer scored the model's tokens only (target
<= 0.5).

Part 2 times what a rollout asks of the generator, on the torch engine the rollouts use
(:func:`rag_gym.train.rollout.make_generator`) and on llama.cpp (``LlamaEngine``, batched, the
embedded Q4_1 model with the same adapter as GGUF): 4 prompts of ``--prompt-tokens`` tokens
(README text), each continued by ``--new-tokens`` sampled tokens (a reply that ends early is
counted and printed), decoded together.

    python benchmarks/grpo_cpu_step.py                       # SynthHop, the shipped adapter
    python benchmarks/grpo_cpu_step.py --against ee83f91~1   # against TRL's log-probabilities
    python benchmarks/grpo_cpu_step.py --config runs/grpo-real-hotpotqa/config.json \\
        --init runs/sft-real-mix                              # a run's own config and start
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from revisions import extract_revision, run_step

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

SHIPPED = Path(__file__).resolve().parents[1] / "rag_gym" / "checkpoints" / "synthhop-search-r1"
#: the step of the default run: the shipped adapter's world and tags, four episodes of one question
DEFAULT = {
    "reward_preset": "none",
    "num_generations": 4,
    "prompts_per_step": 1,
    "beta": 0.04,
    "temperature": 0.6,
    "learning_rate": 1e-4,
    "max_turns": 8,
    "max_turn_tokens": 128,
    "max_completion_tokens": 1536,
}


def timed(obj, name: str, totals: dict, key_of=None) -> None:
    """Add the seconds each call of ``obj.name`` takes to ``totals[key]``."""
    fn = getattr(obj, name)

    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            totals[key_of() if key_of else name] += time.perf_counter() - started

    setattr(obj, name, wrapper)


def train_steps(config: dict, init: str, steps: int, run_dir: str):
    """Per measured step: seconds in all, and per phase; the first step's loss and episodes."""
    import torch

    from rag_gym.train.grpo import EnvGRPOConfig, build_trainer, load_with_adapter

    fields = EnvGRPOConfig.__dataclass_fields__
    cfg = EnvGRPOConfig(
        **{
            **{k: v for k, v in config.items() if k in fields},
            "max_steps": steps + 1,
            "run_dir": run_dir,
            "save_steps": 10_000,
            "max_minutes": None,
            "dynamic_sampling": False,  # a refill replays a group: steps of unequal work
            "stages": [],
            "lora": False,  # the adapter of `init` goes on training
        }
    )
    torch.manual_seed(cfg.seed)
    model, tokenizer = load_with_adapter(cfg.model, init)
    trainer, _ = build_trainer(cfg, model, tokenizer)
    phases: dict[str, float] = collections.defaultdict(float)
    per_step: list[dict[str, float]] = []
    grad = lambda: "policy forward" if torch.is_grad_enabled() else "reference"  # noqa: E731
    timed(trainer, "rollout_func", phases, lambda: "rollout")
    timed(trainer, "_get_per_token_logps_and_entropies", phases, grad)
    timed(trainer.accelerator, "backward", phases, lambda: "backward")

    from transformers import TrainerCallback

    class Split(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            per_step.append(dict(phases))
            phases.clear()

    trainer.add_callback(Split())
    trainer.train()
    steps = [r for r in trainer.state.log_history if "step_time" in r][1:]  # after the warm-up
    first = next(r for r in trainer.state.log_history if "loss" in r)
    return {
        "step_s": [r["step_time"] for r in steps],
        "phases": per_step[1:],
        "first_loss": first["loss"],
        "completion_tokens": [r["episode/completion_tokens"] for r in steps],
        "model_tokens": [r["episode/model_tokens"] for r in steps],
    }


def generation(init: str, prompt_tokens: int, new_tokens: int, rounds: int) -> dict:
    """Seconds for 4 prompts of ``prompt_tokens`` continued by ``new_tokens`` sampled tokens each,
    on the torch engine and on llama.cpp (prefill alone, then prefill + decode)."""
    import torch

    from rag_gym.generation.adapters import adapter_gguf
    from rag_gym.generation.llama_cpp import LlamaCppLM
    from rag_gym.generation.llama_engine import Request
    from rag_gym.train.grpo import load_with_adapter
    from rag_gym.train.rollout import make_generator

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    model, tokenizer = load_with_adapter("embedded", init)
    ids = tokenizer(text)["input_ids"]
    prompts = [ids[i * 50 : i * 50 + prompt_tokens] for i in range(4)]
    torch.manual_seed(0)
    engine = make_generator(model, tokenizer, temperature=1.0)
    out: dict[str, list[float]] = collections.defaultdict(list)

    def torch_run(n: int) -> float:
        started = time.perf_counter()
        got = engine(prompts, n, ())
        elapsed = time.perf_counter() - started
        out["short replies"].append(sum(len(g) < n for g in got))
        return elapsed

    lm = LlamaCppLM(adapter=adapter_gguf(init))

    def llama_run(n: int, seed: int) -> float:
        requests = [
            Request(tokens=p, max_tokens=n, temperature=1.0, top_p=1.0, stop=(), seed=seed + i)
            for i, p in enumerate(prompts)
        ]
        started = time.perf_counter()
        got = lm.engine.run(requests, batched=True)
        elapsed = time.perf_counter() - started
        out["short replies"].append(sum(c.completion_tokens < n for c in got))
        return elapsed

    for r in range(rounds):
        out["torch prefill"].append(torch_run(1))
        out["torch all"].append(torch_run(new_tokens))
        out["llama prefill"].append(llama_run(1, 100 * r))
        out["llama all"].append(llama_run(new_tokens, 100 * r + 10))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--config", help="a GRPO run's config.json (default: SynthHop, see DEFAULT)"
    )
    parser.add_argument("--init", default=str(SHIPPED), help="the adapter both runs start from")
    parser.add_argument("--steps", type=int, default=2, help="measured steps (after 1 warm-up)")
    parser.add_argument("--prompt-tokens", type=int, default=500)
    parser.add_argument("--new-tokens", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2, help="rounds of part 2")
    parser.add_argument("--skip-training", action="store_true")
    parser.add_argument(
        "--against", metavar="REV", help="also train with git revision REV's rag_gym"
    )
    parser.add_argument("--result", help=argparse.SUPPRESS)  # part 1 in a process of its own
    args = parser.parse_args()

    config = json.loads(Path(args.config).read_text()) if args.config else dict(DEFAULT)
    if args.result:
        run_dir = tempfile.mkdtemp(prefix="rag-gym-grpo-cpu-")
        out = train_steps(config, args.init, args.steps, run_dir)
        Path(args.result).write_text(json.dumps(out))
        return
    print(f"python {' '.join(sys.argv)}")
    if not args.skip_training:
        argv = ["--init", args.init, "--steps", str(args.steps)]
        argv += ["--config", args.config] if args.config else []
        runs = {"this tree": run_step(__file__, argv, name="training")}
        if args.against:
            package = extract_revision(args.against, Path(tempfile.mkdtemp()) / "against")
            runs[args.against] = run_step(__file__, argv, package, name="training")
        for name, r in runs.items():
            if not r:
                continue
            phases = collections.defaultdict(list)
            for step in r["phases"]:
                for k, v in step.items():
                    phases[k].append(v)
            print(
                f"{name}: {statistics.mean(r['step_s']):.1f} s a step over {len(r['step_s'])} "
                f"steps; "
                + ", ".join(f"{k} {statistics.mean(v):.1f} s" for k, v in phases.items())
                + f"; {statistics.mean(r['completion_tokens']):.0f} completion tokens an episode, "
                f"{statistics.mean(r['model_tokens']):.0f} by the model; first loss "
                f"{r['first_loss']:.6g}"
            )
        if args.against and all(runs.values()):
            now, then = (statistics.mean(r["step_s"]) for r in runs.values())
            print(f"GRPO step, this tree against {args.against}: {now / then:.2f}x")
    g = generation(args.init, args.prompt_tokens, args.new_tokens, args.rounds)
    best = {k: min(v) for k, v in g.items()}
    n = 4 * args.new_tokens
    print(
        f"rollout-shaped generation, 4 x ({args.prompt_tokens} prompt + {args.new_tokens} sampled) "
        f"tokens: torch engine {best['torch all']:.2f} s (prefill {best['torch prefill']:.2f} s, "
        f"{n / (best['torch all'] - best['torch prefill']):.0f} decoded tokens/s); llama.cpp "
        f"{best['llama all']:.2f} s (prefill {best['llama prefill']:.2f} s, "
        f"{n / (best['llama all'] - best['llama prefill']):.0f} decoded tokens/s); "
        f"llama.cpp / torch: {best['llama all'] / best['torch all']:.2f}x "
        f"(replies that ended before {args.new_tokens} tokens: {max(g['short replies'])})"
    )


if __name__ == "__main__":
    main()

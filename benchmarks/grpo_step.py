"""One multi-turn GRPO step against a single-turn TRL GRPO step that generates as many tokens.

The multi-turn step plays whole episodes (generate until ``</search>``, retrieve, append the
passages, generate again…) with :func:`rag_gym.train.grpo.build_trainer`; the
single-turn step is TRL's own ``GRPOTrainer`` on the same questions, with every completion
forced to the mean number of model-written tokens of the multi-turn episodes
(``min_new_tokens = max_completion_length``). Same model, LoRA, group size, β. Prints the mean
step time of each (after one warm-up step) and the ratio (target ≤ 1.5).

    OMP_NUM_THREADS=2 python benchmarks/grpo_step.py            # embedded SmolLM2-135M, CPU
    python benchmarks/grpo_step.py --model tiny --steps 2       # a quick check
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

WORLD = {"n_passages": 2000, "n_questions": [60, 30, 30]}


def step_times(trainer) -> list[float]:
    times = [row["step_time"] for row in trainer.state.log_history if "step_time" in row]
    return times[1:]  # the first step warms up


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--steps", type=int, default=3, help="measured steps (after 1 warm-up)")
    parser.add_argument("--num-generations", type=int, default=4)
    parser.add_argument("--max-turns", type=int, default=3)
    parser.add_argument("--max-turn-tokens", type=int, default=32)
    args = parser.parse_args()

    import trl
    from datasets import Dataset
    from peft import LoraConfig

    from rag_gym.train.grpo import EnvGRPOConfig, build_trainer
    from rag_gym.train.models import load_policy

    cfg = EnvGRPOConfig(
        model=args.model,
        env_kwargs={"dataset_kwargs": WORLD},
        reward_preset="eval_rar",
        num_generations=args.num_generations,
        prompts_per_step=1,
        beta=0.001,
        max_steps=args.steps + 1,
        max_turns=args.max_turns,
        max_turn_tokens=args.max_turn_tokens,
        max_completion_tokens=args.max_turns * (args.max_turn_tokens + 400),
        temperature=1.0,
        learning_rate=1e-5,
        run_dir="/tmp/rag_gym_bench_grpo/multi",
        save_steps=10_000,
    )
    model, tok = load_policy(args.model)
    started = time.perf_counter()
    multi, rollout = build_trainer(cfg, model, tok)
    multi.train()
    multi_times = step_times(multi)
    model_tokens = [
        r["episode/model_tokens"] for r in multi.state.log_history if "episode/model_tokens" in r
    ]
    tokens = max(1, round(statistics.mean(model_tokens)))
    full = [
        r["episode/completion_tokens"]
        for r in multi.state.log_history
        if "episode/completion_tokens" in r
    ]
    rollout_s = [
        r["episode/rollout_seconds"]
        for r in multi.state.log_history
        if "episode/rollout_seconds" in r
    ][1:]
    print(
        f"multi-turn: {statistics.mean(multi_times):.2f} s/step over {len(multi_times)} steps "
        f"(rollouts {statistics.mean(rollout_s):.2f} s of it); "
        f"{tokens} model tokens per episode ({statistics.mean(full):.0f} with env tokens), "
        f"{args.num_generations} episodes per step ({time.perf_counter() - started:.0f} s total)"
    )

    # Single turn: the same questions as chat prompts, completions of exactly `tokens` tokens.
    engine = rollout.engine
    prompts = []
    for i in range(min(engine.n_questions, 64)):
        engine.envs[0].reset(options={"question_index": i})
        prompts.append(engine.envs[0].messages())
    model, tok = load_policy(args.model)
    single = trl.GRPOTrainer(
        model=model,
        reward_funcs=[lambda completions, **_: [float(len(c)) for c in completions]],
        args=trl.GRPOConfig(
            output_dir="/tmp/rag_gym_bench_grpo/single",
            per_device_train_batch_size=args.num_generations,
            num_generations=args.num_generations,
            max_completion_length=tokens,
            generation_kwargs={"min_new_tokens": tokens},
            learning_rate=1e-5,
            beta=cfg.beta,
            temperature=1.0,
            max_steps=args.steps + 1,
            logging_steps=1,
            save_strategy="no",
            report_to=[],
            use_cpu=not __import__("torch").cuda.is_available(),
            log_completions=False,
            gradient_checkpointing=cfg.gradient_checkpointing,  # as the multi-turn step
        ),
        train_dataset=Dataset.from_dict({"prompt": prompts}),
        processing_class=tok,
        peft_config=LoraConfig(
            r=cfg.lora_r,
            lora_alpha=cfg.lora_alpha,
            target_modules="all-linear",
            task_type="CAUSAL_LM",
        ),
    )
    generation: list[float] = []
    base = model  # TRL wraps it in LoRA; generation reaches this model's generate
    plain_generate = base.generate

    def timed_generate(*a, **kw):
        t0 = time.perf_counter()
        try:
            return plain_generate(*a, **kw)
        finally:
            generation.append(time.perf_counter() - t0)

    base.generate = timed_generate
    single.train()
    single_times = step_times(single)
    lengths = [
        r["completions/mean_length"]
        for r in single.state.log_history
        if "completions/mean_length" in r
    ]
    gen_s = generation[1:] if len(generation) > 1 else generation
    print(
        f"single-turn TRL: {statistics.mean(single_times):.2f} s/step "
        f"(generation {statistics.mean(gen_s) if gen_s else float('nan'):.2f} s of it), "
        f"{statistics.mean(lengths):.0f} tokens per completion"
    )
    ratio = statistics.mean(multi_times) / statistics.mean(single_times)
    print(
        f"multi-turn / single-turn step time: {ratio:.2f} (target <= 1.5: "
        f"{'MET' if ratio <= 1.5 else 'MISSED'})"
    )


if __name__ == "__main__":
    main()

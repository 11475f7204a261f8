"""TRL's own multi-turn path: ``GRPOTrainer(environment_factory=...)`` over a rag-gym env.

The policy calls tools (``search``, ``answer``, ``backtrack``, ``refuse``) that step the env;
the reward is the reward preset's episode return, read from the env instances, with each term
logged at weight 0. Env-written tokens (the tool results) get TRL's ``tool_mask`` 0.

1. Start from a checkpoint: the SFT checkpoint of ``rag-gym train sft`` (``--init runs/<sft run>``
   or the shipped adapter, ``--init rag_gym/checkpoints/synthhop-search-r1``: its LoRA adapter
   over ``--model embedded`` goes on training), the embedded SmolLM2-135M alone
   (``--model embedded``) or a hub id.
2. Give its tokenizer a tool-capable chat template (SmolLM2's own drops tool calls).
3. Warm start: a short SFT on the scripted expert's tool-call transcripts (``--warm-start N``),
   because a model that has never called these tools emits no parsable call; the transcripts
   list the tools in TRL's (alphabetical) order.
4. GRPO with ``environment_factory``.

CPU, small budgets (shows the loop, not learning; about 2-3 minutes a GRPO step)::

    OMP_NUM_THREADS=2 python examples/trl_environment_factory.py --model embedded \\
        --warm-start 64 --sft-steps 60 --max-steps 2

From the SFT checkpoint of the learning pipeline (it already searches and reads in the text-tag
protocol; the warm start moves it to tool calls)::

    OMP_NUM_THREADS=2 python examples/trl_environment_factory.py \\
        --init rag_gym/checkpoints/synthhop-search-r1 --warm-start 64 --sft-steps 16 \\
        --sft-learning-rate 1e-3 --max-steps 1

(the LoRA adapter needs the learning rate it was trained with: at 5e-5 it makes no tool call).

GPU::

    python examples/trl_environment_factory.py --init runs/sft-synthhop \\
        --reward-preset evo_rag --warm-start 400 --sft-steps 200 --max-steps 200 \\
        --prompts-per-step 8 --track

rag-gym's own trainer (``rag-gym train grpo``, ``examples/train_grpo.py``) is the faster path:
without continuous batching, TRL re-reads the whole history at each tool turn.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path


def main() -> None:
    from rag_gym.integrations.trl_env import EnvFactoryConfig
    from rag_gym.train.options import parse_config

    args = parse_config(EnvFactoryConfig, description=__doc__.splitlines()[0])
    import torch
    import trl
    from datasets import Dataset

    from rag_gym.integrations.trl_env import (
        build_dataset,
        episode_return,
        make_env_class,
        prepare_tokenizer,
        reward_term,
        tool_call_demonstrations,
    )
    from rag_gym.train.models import load_policy

    run_name = f"{args.env_id.split('/')[-1]}__{args.exp_name}__{args.seed}__{int(time.time())}"
    out = Path(args.output_dir) / run_name
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(dataclasses.asdict(args), indent=2))
    report_to = ["wandb"] if args.track else ["tensorboard"]
    cpu = not torch.cuda.is_available()

    Env = make_env_class(
        args.env_id,
        reward_preset=args.reward_preset,
        env_kwargs={"dataset_kwargs": {"n_passages": args.n_passages}},
    )
    if args.init:
        from rag_gym.train.grpo import load_with_adapter

        model, tokenizer = load_with_adapter(args.model, args.init)  # the adapter trains on
    else:
        model, tokenizer = load_policy(args.model)
    prepare_tokenizer(tokenizer)

    if args.warm_start:
        demos = tool_call_demonstrations(Env, tokenizer, n=args.warm_start, seed=args.seed)
        sft = trl.SFTTrainer(
            model=model,
            processing_class=tokenizer,
            train_dataset=Dataset.from_list(demos),
            args=trl.SFTConfig(
                output_dir=str(out / "sft"),
                max_steps=args.sft_steps,
                # 4 transcripts a step; on a CPU one per forward pass (4 at once: 12.8 GB RSS,
                # SmolLM2's 49,152-word logits in fp32)
                per_device_train_batch_size=1 if cpu else 4,
                gradient_accumulation_steps=4 if cpu else 1,
                learning_rate=args.sft_learning_rate,
                max_length=2048,
                logging_steps=10,
                report_to=report_to,
                use_cpu=cpu,
                # TRL's defaults are bf16 (emulated, many times slower, on most CPUs) and gradient
                # checkpointing (a third more compute; a 135M policy does not need the memory)
                bf16=not cpu,
                gradient_checkpointing=False,
                save_strategy="no",
                seed=args.seed,
            ),
        )
        sft.train()

    env = Env()  # one step to learn the preset's term names
    env.reset(question_id=env.question_ids[0])
    env.search("a first query")
    terms = sorted(env.return_terms)
    batch = args.num_generations * args.prompts_per_step
    trainer = trl.GRPOTrainer(
        model=model,
        processing_class=tokenizer,
        reward_funcs=[episode_return, *(reward_term(t) for t in terms)],
        train_dataset=build_dataset(Env, seed=args.seed),
        environment_factory=Env,
        args=trl.GRPOConfig(
            output_dir=str(out / "grpo"),
            run_name=run_name,
            max_steps=args.max_steps,
            per_device_train_batch_size=batch,
            num_generations=args.num_generations,
            max_completion_length=args.max_completion_length,
            max_tool_calling_iterations=args.max_tool_calling_iterations,
            temperature=args.temperature,
            learning_rate=args.learning_rate,
            reward_weights=[1.0] + [0.0] * len(terms),
            logging_steps=1,
            report_to=report_to,
            use_cpu=cpu,
            bf16=not cpu,
            gradient_checkpointing=False,
            save_strategy="no",
            seed=args.seed,
        ),
    )
    trainer.train()
    trainer.save_model(str(out / "checkpoint"))
    history = [h for h in trainer.state.log_history if "rewards/episode_return/mean" in h]
    (out / "results.json").write_text(json.dumps(history, indent=2))
    for h in history:
        print(
            f"step {h.get('step')}: return {h['rewards/episode_return/mean']:+.3f}, "
            f"tool calls {h.get('tools/call_frequency', 0):.2f} a rollout"
        )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

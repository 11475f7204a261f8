"""How often a trained policy refuses when it samples: the question a refusal reward depends on.

GRPO can only reward a refusal that its rollouts contain. Before an RL run with
``--refusal``, play the policy at the rollout temperature on SynthHop-Hard training questions
and count how its episodes end::

    python examples/sampled_refusals.py runs/sft-hard-600 --questions 20 --samples 2 \
        --temperature 1.0 --kind unanswerable

It plays the ``search_r1`` agent of the checkpoint (llama.cpp, the checkpoint's tag preset)
in the text env the SFT stage trained in, each sample with its own seed, and prints one JSON
line per episode and a summary line (``final``: how many episodes ended in each action).

``--rollouts`` plays the same questions through GRPO's own rollout path instead: the
transformers policy with the run's adapter, :class:`~rag_gym.train.rollout.RolloutEngine`
and its token budget (``--max-completion-tokens``), all episodes at once, so that the count is
exactly what a GRPO step would sample (``final`` then counts ``refused``, ``answered`` and
``cut``: episodes that ran out of the budget unfinished).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections import Counter

from rag_gym.baselines import make_agent
from rag_gym.generation.llama_cpp import LlamaCppLM
from rag_gym.train.sft import SFTConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="a run folder of rag-gym train sft or grpo")
    parser.add_argument("--questions", type=int, default=20)
    parser.add_argument("--samples", type=int, default=2, help="episodes per question")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--kind", choices=("unanswerable", "answerable"), default="unanswerable")
    parser.add_argument("--split", default="train")
    parser.add_argument("--unanswerable-rate", type=float, default=0.3)
    parser.add_argument(
        "--rollouts", action="store_true", help="sample through GRPO's rollout path instead"
    )
    parser.add_argument("--max-completion-tokens", type=int, default=1536)
    args = parser.parse_args()
    if args.rollouts:
        rollouts(args)
        return

    cfg = SFTConfig(**hard_env(args))
    env = cfg.text_env().make_env(args.split)()
    agent = make_agent(f"search_r1:{args.run}", lm=LlamaCppLM(seed=0))
    final: Counter[str] = Counter()
    for index in questions(env.unwrapped.examples, args):
        for sample in range(args.samples):
            agent.reset(seed=sample)
            agent.config = dataclasses.replace(
                agent.config, temperature=args.temperature, seed=1000 * sample + index
            )
            obs, info = env.reset(seed=sample, options={"index": index})
            done = False
            while not done:
                obs, _, terminated, truncated, info = env.step(agent.act(obs, info))
                done = terminated or truncated
            action = str(info.get("action_type"))
            final[action] += 1
            em = info.get("scores", {}).get("em")
            print(json.dumps({"index": index, "sample": sample, "final": action, "em": em}))
    env.close()
    print_summary(args, final)


def print_summary(args: argparse.Namespace, final: Counter[str], **extra: object) -> None:
    """The summary line both paths end with: how many episodes ended in each way."""
    summary = {"run": args.run, "kind": args.kind, "temperature": args.temperature}
    summary.update(episodes=sum(final.values()), final=dict(final), **extra)
    print(json.dumps(summary))


def hard_env(args: argparse.Namespace) -> dict:
    """The env both paths probe: SynthHop-Hard with the ``evo_rag`` tags, as the SFT trained."""
    return {
        "env_id": "rag_gym/SynthHop-Hard-v0",
        "tags": "evo_rag",
        "env_kwargs": {"dataset_kwargs": {"unanswerable_rate": args.unanswerable_rate}},
    }


def questions(examples: list, args: argparse.Namespace) -> list[int]:
    """The first ``--questions`` indices of ``--kind``."""
    answerable = args.kind == "answerable"
    return [i for i, ex in enumerate(examples) if ex.answerable == answerable][: args.questions]


def rollouts(args: argparse.Namespace) -> None:
    """The same count through GRPO's rollout path (transformers, the run's adapter)."""
    import torch

    from rag_gym.train.episodes import rollout_engine
    from rag_gym.train.rollout import make_generator
    from rag_gym.train.grpo import EnvGRPOConfig, load_with_adapter

    cfg = EnvGRPOConfig(
        **hard_env(args),
        reward_preset="none",
        refusal=0.5,
        max_completion_tokens=args.max_completion_tokens,
    )
    model, tokenizer = load_with_adapter(cfg.model, args.run, trainable=False)
    model.eval()
    engine = rollout_engine(cfg, tokenizer, args.split)
    generate = make_generator(model, tokenizer, temperature=args.temperature)
    torch.manual_seed(0)  # the samples are torch's: seeded, so the count repeats
    want = questions(engine.envs[0].unwrapped.examples, args)
    indices = [i for i in want for _ in range(args.samples)]
    final: Counter[str] = Counter()
    episodes = engine.play(generate, indices)
    for index, episode in zip(indices, episodes, strict=True):
        refused = episode.reward_terms.get("refusal", 0.0) != 0.0
        end = "cut" if not episode.finished else "refused" if refused else "answered"
        final[end] += 1
        print(json.dumps({"index": index, "final": end, "em": episode.em}))
    searches = sum(e.num_searches for e in episodes) / max(1, len(episodes))
    print_summary(args, final, path="rollouts", searches=searches)


if __name__ == "__main__":
    main()

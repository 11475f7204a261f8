"""Compose your own dense reward from rag-gym's terms, with gym.make, and watch it per step.

    python examples/custom_reward.py

Runs without a model or a network on the embedded SynthHop world. The stack: the env's own EM
at the end, EVO-RAG's retrieval-hit bonus and step cost with our own weights, and Eval-RAR's
evaluation reward. Two scripted agents play the same question so the terms differ: an oracle
that searches each hop's sub-question (from the question's decomposition) and answers right,
and a lazy one that searches once and guesses. Every term is in ``info["reward_terms"]``.
"""

from __future__ import annotations

import gymnasium as gym

import rag_gym  # noqa: F401  (registers the envs)
from rag_gym.envs import ActionType
from rag_gym.wrappers import EvaluationReward, RetrievalHitReward, StepCost

env = gym.make("rag_gym/SynthHop-v0", split="validation")
env = RetrievalHitReward(env, weight=0.5)  # +0.5 for a search that finds gold, -0.5 for a miss
env = StepCost(env, weight=0.05)  # -0.05 per step
env = EvaluationReward(env)  # +0.1 when a wrong answer followed a note that named the gold answer


def play(name: str, plan) -> None:
    env.reset(seed=3)
    example = env.unwrapped.current_example
    print(f"\n{name}: {example.question}")
    total = 0.0
    for action in plan(example):
        _, reward, terminated, truncated, info = env.step(action)
        total += reward
        terms = ", ".join(f"{k}={v:+.2f}" for k, v in info["reward_terms"].items() if v)
        print(
            f"  {info['action_type']:8s} {action['text'][:48]!r:52s} reward {reward:+.3f}  {terms}"
        )
        if terminated or truncated:
            break
    print(f"  return {total:+.3f}")


def oracle(example):
    for hop in example.meta["decomposition"]:
        yield {"type": ActionType.SEARCH, "text": hop["question"]}
    yield {"type": ActionType.EVALUATE, "text": f"The last passage gives {example.answer}."}
    yield {"type": ActionType.ANSWER, "text": example.answer}


def lazy(example):
    yield {"type": ActionType.SEARCH, "text": example.question}
    yield {"type": ActionType.EVALUATE, "text": f"Maybe {example.answer}, maybe not."}
    yield {"type": ActionType.ANSWER, "text": "no idea"}


play("oracle", oracle)
play("lazy", lazy)

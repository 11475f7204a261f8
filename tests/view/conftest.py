"""Run folders for the report tests: a small evaluation of three agents, and a training run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rag_gym.baselines import make_agent
from rag_gym.evaluate import EvalConfig, evaluate
from tests.conftest import SMALL_WORLD, EchoLM

AGENTS = ("naive_rag", "random", "oracle")
N = 8


def reader_reply(answers: dict[str, str]):
    """Right on questions whose text has an even length, wrong on the others."""

    def reply(prompt) -> str:
        text = prompt[-1]["content"] if isinstance(prompt, list) else prompt
        question = next(line[10:] for line in text.splitlines() if line.startswith("Question: "))
        return f"Answer: {answers[question]}." if len(question) % 2 == 0 else "Answer: nobody."

    return reply


@pytest.fixture(scope="session")
def eval_run(tmp_path_factory) -> Path:
    """An evaluation run folder: naive RAG, random and the oracle reader on 8 questions."""
    from rag_gym.data.synthhop import world_for

    world = world_for("default", **SMALL_WORLD)
    answers = {q.question: q.answer for q in world.questions["validation"]}
    lm = EchoLM(reply=reader_reply(answers))
    out = tmp_path_factory.mktemp("runs")
    evaluate(
        EvalConfig(
            n=N,
            seed=1,
            agents=AGENTS,
            env_kwargs={"dataset_kwargs": SMALL_WORLD},
            out_dir=str(out),
            run_name="eval",
        ),
        lambda name, env: make_agent(name, lm=lm, seed=1, env=env),
    )
    return out / "eval"


def write_training_run(path: Path, steps=(1, 2)) -> Path:
    """A training run folder as the trainers write it: results.json with the log history and
    rollouts sampled at ``steps`` in steps.jsonl (written through the real RolloutLog)."""
    from types import SimpleNamespace

    from rag_gym.train.rollout_log import RolloutLog

    path.mkdir(parents=True)
    history = [{"loss": 1.0 / s, "reward": 0.1 * s, "step": s, "epoch": s / 10} for s in (1, 2, 3)]
    (path / "results.json").write_text(json.dumps({"stage": "grpo", "log_history": history}))
    log = RolloutLog(path, every=1, n=2)
    for s in steps:
        episodes = [
            SimpleNamespace(
                episode_return=float(s == 2),
                em=float(s == 2),
                trace={
                    "question_id": f"q{i}",
                    "question": f"Who founded company {i}?",
                    "answers": ["Ada"],
                    "gold_ids": ["g1"],
                    "steps": [
                        {
                            "step": 1,
                            "action": "SEARCH",
                            "text": f"company {i} founder at step {s}",
                            "raw_output": f"<search>company {i} founder at step {s}</search>",
                            "retrieved": [{"id": "g1", "rank": 1, "score": 3.0, "gold": True}],
                            "reward": 0.0,
                            "reward_terms": {"answer": 0.0},
                            "prompt_tokens": 0,
                            "completion_tokens": 9,
                            "invalid": False,
                            "message": "",
                        }
                    ],
                    "passages": {"g1": {"title": "Company", "text": "Ada founded it."}},
                },
            )
            for i in range(3)
        ]
        assert log(s, episodes) == 2
    return path

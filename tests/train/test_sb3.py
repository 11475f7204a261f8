"""Stable-Baselines3 on the macro-action env: PPO and DQN train (parameters change, a loss is
logged under losses/), fixed heuristics and evaluation on a split, the env stack's options."""

from __future__ import annotations

import sys

import gymnasium as gym
import numpy as np
import pytest
import torch

import rag_gym  # noqa: F401
from rag_gym.data import Corpus, Passage, QAExample
from rag_gym.retrieval import BM25Retriever
from rag_gym.train.sb3 import (
    episode_stats_callback,
    eval_callback,
    fixed_sequences,
    make_logger,
    make_sb3_env,
    play_split,
    question_kind,
    rank_fixed_sequences,
    require_sb3,
    sequence_policy,
)
from tests.conftest import SMALL_WORLD

PASSAGES = [
    Passage(
        "ada",
        "Ada Vell",
        "Ada Vell is a painter born in 1901 in Orrin. Ada Vell works for Kestrel Guild.",
    ),
    Passage("orrin", "Orrin", "Orrin is a city in Tamaria, founded in 1415."),
    Passage("bo", "Bo Rann", "Bo Rann is a poet born in 1790 in Lusk."),
    Passage("lusk", "Lusk", "Lusk is a city in Vorn, founded in 1300."),
]
QUESTIONS = [
    QAExample(
        "q1", "In which country is the birthplace of Ada Vell?", ("Tamaria",), ("ada", "orrin")
    ),
    QAExample("q2", "In which country is the birthplace of Bo Rann?", ("Vorn",), ("bo", "lusk")),
    QAExample(
        "q3",
        "Who was born first, Ada Vell or Bo Rann?",
        ("Bo Rann",),
        ("ada", "bo"),
        type="comparison",
    ),
]


def tiny_env(**kwargs) -> gym.Env:
    return make_sb3_env(
        examples=QUESTIONS, retriever=BM25Retriever(Corpus(PASSAGES)), n_features=32, **kwargs
    )


def params(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.policy.parameters() if p.requires_grad]


def recording_logger():
    """make_logger with a writer that keeps every dumped key."""
    from stable_baselines3.common.logger import KVWriter

    class Keep(KVWriter):
        def __init__(self) -> None:
            self.rows: list[dict] = []

        def write(self, key_values, key_excluded, step=0) -> None:
            self.rows.append(dict(key_values))

        def close(self) -> None:
            pass

    logger = make_logger(None, [])
    keep = Keep()
    logger.output_formats.append(keep)
    return logger, keep


@pytest.fixture
def sb3():
    return pytest.importorskip("stable_baselines3", reason="needs pip install 'rag-gym[sb3]'")


def test_ppo_trains_and_logs_a_loss(sb3):
    env = make_sb3_env(dataset_kwargs=SMALL_WORLD, n_features=64)
    model = sb3.PPO("MlpPolicy", env, n_steps=128, batch_size=32, n_epochs=2, seed=0, device="cpu")
    logger, keep = recording_logger()
    model.set_logger(logger)
    before = params(model)
    evaluator = eval_callback(
        make_sb3_env(split="validation", dataset_kwargs=SMALL_WORLD, n_features=64),
        every=128,
        n_questions=4,
    )
    model.learn(256, callback=[evaluator, episode_stats_callback()])
    after = params(model)
    assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))
    logged = {k: v for row in keep.rows for k, v in row.items()}
    assert np.isfinite(logged["losses/loss"]) and "losses/policy_gradient_loss" in logged
    assert "charts/learning_rate" in logged and "charts/total_timesteps" in logged
    assert "charts/em" in logged and 0.0 <= logged["charts/em"] <= 1.0
    assert not any(k.startswith(("train/", "rollout/", "time/")) for k in logged)
    # evaluated at the start, every 128 steps and at the end, on 4 validation questions
    assert [s for s, _ in evaluator.history] == [1, 129, 256]
    assert all(stats["n"] == 4 for _, stats in evaluator.history) and "eval/em" in logged


def test_dqn_trains_and_logs_a_loss(sb3):
    env = make_sb3_env(dataset_kwargs=SMALL_WORLD, n_features=64)
    model = sb3.DQN(
        "MlpPolicy",
        env,
        buffer_size=1000,
        learning_starts=100,
        batch_size=32,
        train_freq=4,
        seed=0,
        device="cpu",
    )
    logger, keep = recording_logger()
    model.set_logger(logger)
    before = params(model)
    model.learn(300, log_interval=1)
    after = params(model)
    assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))
    logged = {k: v for row in keep.rows for k, v in row.items()}
    assert np.isfinite(logged["losses/loss"]) and logged["losses/n_updates"] > 0


def test_fixed_sequences_and_play_split_score_real_episodes():
    assert len(fixed_sequences(5, 2)) == 7 * (1 + 5 + 25)
    assert len(fixed_sequences(3, 0)) == 5 and fixed_sequences(3, 0)[-1][-1] == "REFUSE"
    env = tiny_env(step_cost=0.02)
    # "search the question, follow the birthplace, answer the country" solves q1 and q2 only
    follow = ("SEARCH_QUESTION", "SEARCH_CANDIDATE_3", "ANSWER_CANDIDATE_2")
    stats = play_split(env, sequence_policy(env, follow))
    assert stats["n"] == 3 and stats["em"] == pytest.approx(2 / 3)
    assert stats["steps"] == pytest.approx(3.0)
    assert stats["return"] == pytest.approx(2 / 3 - 3 * 0.02)
    compare = play_split(env, sequence_policy(env, ["SEARCH_QUESTION", "ANSWER_EARLIEST"]))
    assert compare["em"] == pytest.approx(1 / 3)
    # on q1 and q2 ANSWER_EARLIEST does not apply: an invalid step, then the REFUSE that ends
    assert compare["invalid"] == pytest.approx(2 / 3) and compare["refused"] == pytest.approx(2 / 3)
    grouped = play_split(env, sequence_policy(env, follow), group_by=question_kind)
    assert (grouped["em/question"], grouped["n/question"]) == (1.0, 2)
    assert (grouped["em/comparison"], grouped["n/comparison"]) == (0.0, 1)
    chain = QAExample("c", "q", ("Vell",), meta={"relations": ["birthplace", "country"]})
    assert question_kind(chain) == "birthplace>country"
    ranked = rank_fixed_sequences(env, [("SEARCH_QUESTION", "ANSWER_EARLIEST"), follow])
    assert ranked[0][0] == follow and play_split(env, lambda obs, t: 0, n_questions=1)["n"] == 1


def test_sequence_policy_errors():
    env = tiny_env()
    with pytest.raises(ValueError, match="did you mean 'ANSWER_EARLIEST'"):
        sequence_policy(env, ["ANSWER_EARLYEST"])
    with pytest.raises(ValueError, match="at least one macro"):
        sequence_policy(env, [])
    with pytest.raises(ValueError, match="expected an env with MacroActions"):
        sequence_policy(gym.make("rag_gym/SynthHop-v0", dataset_kwargs=SMALL_WORLD), [0])


def test_make_sb3_env_options():
    with pytest.raises(ValueError, match="expected step_cost >= 0"):
        tiny_env(step_cost=-0.1)
    with pytest.raises(TypeError, match="expected step_cost to be a number"):
        tiny_env(step_cost="0.1")
    env = tiny_env(step_cost=0.0)
    env.reset(options={"question_id": "q1"})
    _, reward, *_ = env.step(0)
    assert reward == 0.0
    # the masks reach through TextToVector, as SB3's vector envs call them
    mask = env.get_wrapper_attr("action_masks")()
    assert mask.dtype == bool and mask[:6].tolist() == [True] * 5 + [False]
    # dataset_kwargs update the registration's: SynthHop-Hard keeps its preset (2-4 hops)
    hard = make_sb3_env(
        "rag_gym/SynthHop-Hard-v0", dataset_kwargs={"n_passages": 2000, "n_questions": [60, 30, 30]}
    )
    assert max(ex.hops for ex in hard.unwrapped.examples) > 2
    assert len(hard.unwrapped.examples) == 60


def test_missing_sb3_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "stable_baselines3", None)
    with pytest.raises(ImportError, match=r"pip install .*'rag-gym\[sb3\]'"):
        require_sb3()
    with pytest.raises(ImportError, match=r"rag-gym\[sb3\]"):
        make_logger(None)

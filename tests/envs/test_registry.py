"""Every registered id: Gymnasium's env checker and a 50-step seeded determinism rollout."""

from __future__ import annotations

import json
import re
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import rag_gym  # noqa: F401
from rag_gym.data import load, pooled_corpus
from rag_gym.envs import ActionType, env_ids
from tests.conftest import SMALL_WORLD, shared_file

REAL = {
    "rag_gym/HotpotQA-v0": "hotpotqa/hotpot_dev_distractor_300.json",
    "rag_gym/2WikiMultiHopQA-v0": "2wikimultihopqa/dev_250.json",
    "rag_gym/MuSiQue-v0": "musique/musique_ans_dev_100.jsonl",
    "rag_gym/Bamboogle-v0": "bamboogle/bamboogle.jsonl",
}


def make_kwargs(env_id: str, tmp_path_factory) -> dict:
    if env_id.startswith("rag_gym/SynthHop"):
        preset = "hard" if "Hard" in env_id else "default"
        return {"dataset_kwargs": {"preset": preset, **SMALL_WORLD}}
    kwargs = {"data_path": str(shared_file(REAL[env_id]))}
    if env_id == "rag_gym/Bamboogle-v0":
        # Bamboogle has no corpus: search the HotpotQA sample's paragraphs (real Wikipedia text)
        corpus, _ = pooled_corpus(load("hotpotqa", path=shared_file(REAL["rag_gym/HotpotQA-v0"])))
        path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
        corpus.to_jsonl(path)
        kwargs["corpus"] = str(path)
    return kwargs


def test_registry_is_complete():
    assert env_ids() == [
        "rag_gym/SynthHop-v0",
        "rag_gym/SynthHop-Hard-v0",
        "rag_gym/HotpotQA-v0",
        "rag_gym/2WikiMultiHopQA-v0",
        "rag_gym/MuSiQue-v0",
        "rag_gym/Bamboogle-v0",
    ]
    for env_id in env_ids():
        spec = gym.spec(env_id)
        assert spec.max_episode_steps == 20
        assert gym.envs.registration.EnvSpec.from_json(spec.to_json()) == spec


@pytest.mark.parametrize("env_id", env_ids())
def test_check_env(env_id, tmp_path_factory):
    env = gym.make(env_id, **make_kwargs(env_id, tmp_path_factory))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any checker warning fails the test
        check_env(env.unwrapped)
    env.close()


def _policy(rng: np.random.Generator, obs: str, info: dict) -> dict:
    words = re.findall(r"\w+", obs) or ["x"]
    atype = int(rng.choice(np.flatnonzero(info["action_mask"]), p=None))
    if atype in (ActionType.ANSWER, ActionType.REFUSE) and rng.random() < 0.7:
        atype = ActionType.SEARCH  # keep episodes going for longer
    n = int(rng.integers(0, 5))
    text = " ".join(words[int(i)] for i in rng.integers(0, len(words), size=n))
    return {"type": atype, "text": text}


def _rollout(env_id: str, kwargs: dict, steps: int = 50) -> list:
    env = gym.make(env_id, **kwargs)
    rng = np.random.default_rng(123)
    obs, info = env.reset(seed=42)
    trace = [("reset", obs, info)]
    episode = 0
    for _ in range(steps):
        obs, reward, terminated, truncated, info = env.step(_policy(rng, obs, info))
        assert env.observation_space.contains(obs)
        assert (
            isinstance(reward, float)
            and isinstance(terminated, bool)
            and isinstance(truncated, bool)
        )
        trace.append((obs, reward, terminated, truncated, info))
        if terminated or truncated:
            episode += 1
            obs, info = env.reset(seed=42 + episode)
            trace.append(("reset", obs, info))
    env.close()
    return trace


def _canon(trace: list) -> str:
    return json.dumps(
        trace, default=lambda o: o.tolist() if isinstance(o, np.ndarray) else str(o), sort_keys=True
    )


@pytest.mark.parametrize("env_id", env_ids())
def test_seeded_determinism_50_steps(env_id, tmp_path_factory):
    kwargs = make_kwargs(env_id, tmp_path_factory)
    first, second = _rollout(env_id, kwargs), _rollout(env_id, kwargs)
    assert _canon(first) == _canon(second)
    assert sum(1 for t in first if t[0] != "reset") == 50
    # the rollout really exercised the env: searches retrieved passages, episodes ended
    assert any(t[0] != "reset" and t[4]["retrieved_ids"] for t in first)
    assert any(t[0] == "reset" for t in first[1:])

"""rag-gym envs through SkyRL-gym's own API (skyrl_gym.make, BaseTextEnv.init/step): episodes
equal to gym.make's."""

from __future__ import annotations

import pytest

import rag_gym  # noqa: F401
from rag_gym.wrappers.presets import make as make_with_preset
from rag_gym.wrappers.text_actions import TextActions
from tests.conftest import SMALL_WORLD

skyrl_gym = pytest.importorskip("skyrl_gym", reason="needs skyrl-gym (the test extra)")
from rag_gym.integrations.skyrl import RagGymSkyRLEnv, dataset_rows, register  # noqa: E402

CONFIG = {"env_id": "rag_gym/SynthHop-v0", "env_kwargs": {"dataset_kwargs": SMALL_WORLD}}


@pytest.mark.parametrize("preset", ["none", "eval_rar"])
def test_episodes_equal_gym_make(preset):
    register()
    config = {**CONFIG, "reward_preset": preset, "split": "validation"}
    twin = make_with_preset(
        "rag_gym/SynthHop-v0", preset, split="validation", dataset_kwargs=SMALL_WORLD
    )
    twin = TextActions(twin, tags="eval_rar" if preset == "eval_rar" else "search_r1")
    examples = twin.unwrapped.examples
    for ex in examples[:10]:
        env = skyrl_gym.make("rag_gym", env_config=config, extras={"question_id": ex.id})
        assert isinstance(env, RagGymSkyRLEnv)
        messages, info = env.init([])
        obs, _ = twin.reset(options={"question_id": ex.id})
        assert info["question_id"] == ex.id
        assert messages == twin.messages()
        actions = [
            "no tags at all",
            f"<search>{ex.question}</search>",
            f"<answer>{ex.answers[0]}</answer>",
        ]
        total = 0.0
        turns = 0
        for action in actions:
            turns += 1
            out = env.step(action)
            obs, reward, term, trunc, _ = twin.step(action)
            assert out["reward"] == reward
            assert out["done"] == (term or trunc)
            assert out["observations"] == (
                [] if out["done"] else [{"role": "user", "content": obs}]
            )
            total += reward
            if out["done"]:
                break
        assert turns == 3 and out["done"]
        metrics = env.get_metrics()
        assert metrics["episode_return"] == pytest.approx(total)
        assert metrics["em"] == 1.0 and metrics["searches"] == 1


def test_max_turns_ends_the_episode_and_bad_config_is_named():
    env = RagGymSkyRLEnv({**CONFIG, "max_turns": 2}, {"index": 0})
    env.init()
    assert not env.step("<search>a</search>")["done"]
    assert env.step("<search>b</search>")["done"]
    with pytest.raises(ValueError, match="unknown rag-gym SkyRL env options"):
        RagGymSkyRLEnv({**CONFIG, "envid": "x"})
    with pytest.raises(ValueError, match="expected env_id"):
        RagGymSkyRLEnv({})
    with pytest.raises(ValueError, match="did you mean"):
        RagGymSkyRLEnv({"env_id": "rag_gym/SynthHop-v9"})


def test_dataset_rows_play_their_question():
    rows = dataset_rows("rag_gym/SynthHop-v0", split="test", dataset_kwargs=SMALL_WORLD)
    assert len(rows) == SMALL_WORLD["n_questions"][2]
    row = rows[3]
    env = RagGymSkyRLEnv({**CONFIG, "split": "test"}, row["extras"])
    messages, info = env.init(row["prompt"])
    assert messages == row["prompt"] and info["question_id"] == row["extras"]["question_id"]
    assert row["reward_spec"]["ground_truth"]["target"]

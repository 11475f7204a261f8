"""TextToVector: parsing the SearchEnv rendering, the hashing encoder, every block of the
layout, malformed text, check_env, the embedded MiniLM."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import rag_gym  # noqa: F401
from rag_gym.data import Corpus, Passage, QAExample
from rag_gym.envs import ActionType, SearchEnv
from rag_gym.retrieval import BM25Retriever
from rag_gym.wrappers import MacroActions, TextToVector
from rag_gym.wrappers.vectorize import HashingEncoder, parse_observation
from tests.conftest import SMALL_WORLD, requires_dense

PASSAGES = [
    Passage(
        "ada",
        "Ada Vell",
        "Ada Vell is a painter born in 1901 in Orrin. Ada Vell works for Kestrel Guild.",
    ),
    Passage("orrin", "Orrin", "Orrin is a city in Tamaria, founded in 1415."),
    Passage("bo", "Bo Rann", "Bo Rann is a poet born in 1790 in Lusk."),
]
QUESTIONS = [
    QAExample(
        "q1", "In which country is the birthplace of Ada Vell?", ("Tamaria",), ("ada", "orrin")
    ),
    QAExample("q2", "Who was born first, Ada Vell or Bo Rann?", ("Bo Rann",), ("ada", "bo")),
    QAExample("q3", "Does Ada Vell work for Kestrel Guild?", ("yes",), ("ada",)),
]


def search_env() -> SearchEnv:
    return SearchEnv(examples=QUESTIONS, retriever=BM25Retriever(Corpus(PASSAGES)), k=2)


def make(**kwargs) -> TextToVector:
    return TextToVector(MacroActions(search_env()), n_features=64, **kwargs)


def test_parse_observation_reads_back_the_rendering():
    env = search_env()
    env.reset(options={"question_id": "q1"})
    env.step({"type": ActionType.SEARCH, "text": "Ada Vell"})
    env.step({"type": ActionType.EVALUATE, "text": "Orrin next."})
    obs, *_ = env.step({"type": ActionType.SEARCH, "text": "Orrin"})
    parsed = parse_observation(obs)
    assert parsed["question"] == "In which country is the birthplace of Ada Vell?"
    assert [s["query"] for s in parsed["searches"]] == ["Ada Vell", "Orrin"]
    assert parsed["searches"][1]["passages"][0] == {
        "title": "Orrin",
        "text": "Orrin is a city in Tamaria, founded in 1415.",
    }
    assert len(parsed["searches"][0]["passages"]) == 2
    assert parsed["notes"] == ["Orrin next."] and parsed["message"] == ""
    obs, *_ = env.step({"type": ActionType.BACKTRACK, "text": ""})
    parsed = parse_observation(obs)
    assert parsed["message"].startswith("Backtracked") and len(parsed["searches"]) == 1


def test_parse_observation_of_other_text_is_the_question():
    assert parse_observation("just some text\n(1) x")["question"] == "just some text\n(1) x"
    assert parse_observation("")["searches"] == []


def test_hashing_is_deterministic_keyed_and_normalised():
    a, b = HashingEncoder(64, seed=0), HashingEncoder(64, seed=0)
    text = "Who founded the publisher of The Iron Bell?"
    va, vb = a([text])[0], b([text])[0]
    assert np.array_equal(va, vb) and np.isclose(np.linalg.norm(va), 1.0)
    assert not np.array_equal(va, HashingEncoder(64, seed=1)([text])[0])
    # bigrams: the same words in another order give another vector
    assert not np.array_equal(
        a(["the author of the mentor"])[0], a(["the mentor of the author"])[0]
    )
    assert np.array_equal(a(["WHO founded"])[0], a(["who founded"])[0])


def test_blocks_follow_the_episode():
    env = make()
    obs, _ = env.reset(options={"question_id": "q1"})
    lay = env.layout
    assert obs.shape == env.observation_space.shape == (3 * 64 + 5 * 20 + 11 + 6 + 5,)
    assert env.observation_space.contains(obs)
    enc = HashingEncoder(64)
    assert np.allclose(obs[lay["question"]], enc([QUESTIONS[0].question])[0])
    assert not obs[lay["focus"]].any() and not obs[lay["candidates"]].any()
    assert obs[lay["steps"]].tolist()[:2] == [1, 0] and obs[lay["searches"]][0] == 1
    assert obs[lay["flags"]].tolist() == [0, 0, 0, 0, 1]  # no passage yet

    obs, *_ = env.step(0)  # SEARCH_QUESTION: the focus is Ada Vell's passage
    ada = PASSAGES[0]
    assert np.allclose(obs[lay["focus"]], enc([f"{ada.title}: {ada.text}"])[0])
    assert obs[lay["steps"]].argmax() == 1 and obs[lay["searches"]].argmax() == 1
    assert obs[lay["flags"]].tolist() == [0, 0, 1, 0, 0]  # its title is in the query
    cands = obs[lay["candidates"]].reshape(5, 20)
    # painter (descriptor), 1901 (number), Orrin (name), Kestrel Guild (name), no 5th
    assert cands[:, :3].argmax(1)[:4].tolist() == [2, 1, 0, 0] and not cands[4].any()
    assert np.allclose(cands[3, 4:], HashingEncoder(16, seed=1)(["works for"])[0])

    obs, *_ = env.step(5)  # SEARCH_CANDIDATE_5 does not exist: an invalid step
    assert obs[lay["flags"]][0] == 1 and obs[lay["steps"]].argmax() == 2
    env.step(3)  # search Orrin
    obs, *_ = env.step(12)  # BACKTRACK
    assert obs[lay["flags"]][1] == 1 and obs[lay["searches"]].argmax() == 1


def test_comparison_and_in_question_flags():
    env = make()
    obs, _ = env.reset(options={"question_id": "q2"})
    assert obs[env.layout["flags"]][3] == 1  # two names in the question
    env.reset(options={"question_id": "q3"})
    obs, *_ = env.step(0)
    cands = obs[env.layout["candidates"]].reshape(5, 20)
    assert cands[:4, 3].tolist() == [0, 0, 0, 1]  # Kestrel Guild is named in the question


def test_step_bucket_saturates():
    env = make()
    env.reset(options={"question_id": "q1"})
    for _ in range(12):
        obs, *_ = env.step(12)  # BACKTRACK with nothing to drop, 12 times
    assert obs[env.layout["steps"]].argmax() == 10


def test_malformed_text_never_raises():
    env = make()
    env.reset(options={"question_id": "q1"})
    for text in ["", "Question: ", "Question: q\n\n[1] Search: \n  (1) ", "\ufffd" * 50, "x: y"]:
        vec = env.observation(text)
        assert env.observation_space.contains(vec)
    with pytest.raises(TypeError, match="expected a text observation, got int"):
        env.observation(3)


def test_constructor_errors():
    with pytest.raises(ValueError, match="did you mean 'hashing'"):
        make(encoder="hashin")
    with pytest.raises(ValueError, match=r"expected n_features in 16..65536, got 8"):
        TextToVector(search_env(), n_features=8)
    with pytest.raises(TypeError, match="expected n_candidates to be an int"):
        TextToVector(search_env(), n_candidates=2.0)
    with pytest.raises(TypeError, match="expected seed to be an int"):
        TextToVector(search_env(), seed="0")


def test_n_candidates_follows_the_macro_wrapper():
    env = TextToVector(MacroActions(search_env(), n_candidates=3), n_features=32)
    assert env.n_candidates == 3
    assert env.layout["candidates"] == slice(96, 96 + 3 * 20)


@pytest.mark.filterwarnings("ignore:.*different from the unwrapped")
def test_check_env_and_determinism_on_synthhop():
    env = TextToVector(MacroActions(gym.make("rag_gym/SynthHop-v0", dataset_kwargs=SMALL_WORLD)))
    check_env(env, skip_render_check=True)
    rng = np.random.default_rng(0)
    actions = rng.integers(0, 14, size=50).tolist()

    def rollout():
        out = [env.reset(seed=5)[0]]
        for a in actions:
            obs, _, terminated, truncated, _ = env.step(a)
            assert env.observation_space.contains(obs)
            out.append(obs)
            if terminated or truncated:
                out.append(env.reset()[0])
        return np.stack(out)

    assert np.array_equal(rollout(), rollout())


@pytest.mark.slow
@requires_dense
def test_minilm_encoder_embeds_the_question():
    from rag_gym.retrieval.encoders import default_encoder

    env = TextToVector(MacroActions(search_env()), encoder="minilm")
    obs, _ = env.reset(options={"question_id": "q1"})
    assert obs.shape == (3 * 384 + 5 * 20 + 11 + 6 + 5,) and env.observation_space.contains(obs)
    expected = default_encoder()([QUESTIONS[0].question])[0]
    assert np.allclose(obs[env.layout["question"]], expected, atol=1e-5)
    obs2, *_ = env.step(0)
    assert np.linalg.norm(obs2[env.layout["focus"]]) == pytest.approx(1.0, abs=1e-4)

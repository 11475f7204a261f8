"""MacroActions: candidate extraction, the queries and answers each macro writes, masks,
inapplicable and out-of-range actions, check_env."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import rag_gym  # noqa: F401
from rag_gym.data import Corpus, Passage, QAExample
from rag_gym.envs import SearchEnv
from rag_gym.retrieval import BM25Retriever
from rag_gym.wrappers import MacroActions
from rag_gym.wrappers.macro import candidates, focus_passage, question_entities
from tests.conftest import SMALL_WORLD

PASSAGES = [
    Passage(
        "ada",
        "Ada Vell",
        "Ada Vell is a painter born in 1901 in Orrin. Ada Vell works for Kestrel Guild.",
    ),
    Passage("orrin", "Orrin", "Orrin is a city in Tamaria, founded in 1415."),
    Passage(
        "guild",
        "Kestrel Guild",
        "Kestrel Guild is a craft guild founded in 1820 by Bo Rann. Its headquarters are in Orrin.",
    ),
    Passage("bo", "Bo Rann", "Bo Rann is a poet born in 1790 in Lusk."),
    Passage(
        "tamaria",
        "Tamaria",
        "Tamaria is a country whose capital is Orrin. Its currency is the vell crown, and it "
        "was established in 1200.",
    ),
]
QUESTIONS = [
    QAExample(
        "q1", "In which country is the birthplace of Ada Vell?", ("Tamaria",), ("ada", "orrin")
    ),
    QAExample("q2", "Who was born first, Ada Vell or Bo Rann?", ("Bo Rann",), ("ada", "bo")),
    QAExample("q3", "Who founded Zorn Academy?", ("Ebbin",), (), answerable=False),
]


def make(**kwargs) -> MacroActions:
    env = SearchEnv(examples=QUESTIONS, retriever=BM25Retriever(Corpus(PASSAGES)), k=3)
    return MacroActions(env, **kwargs)


M = {name: i for i, name in enumerate(make().macro_names)}


def test_candidates_of_synthhop_shaped_passages():
    person, orrin, guild, _, country = PASSAGES
    assert candidates(person.text, person.title) == ["painter", "1901", "Orrin", "Kestrel Guild"]
    assert candidates(orrin.text, orrin.title) == ["city", "Tamaria", "1415"]
    # "Its" starts a sentence and is no name; the org's own name is not a candidate
    assert candidates(guild.text, guild.title) == ["craft guild", "1820", "Bo Rann", "Orrin"]
    assert candidates(country.text, country.title) == ["country", "Orrin", "vell crown", "1200"]
    # "The" stays inside a name; numbers inside larger numbers or decimals are not years
    assert candidates("It cost 1,234 or 12.50 in 2001. The Iron Bell rang.") == [
        "2001",
        "The Iron Bell",
    ]
    assert candidates("") == []


def test_focus_is_the_passage_the_query_names():
    ps = [{"title": "Bo Rann", "text": "x"}, {"title": "Orrin", "text": "y"}]
    assert focus_passage("founded in Orrin", ps)["title"] == "Orrin"
    assert focus_passage("nothing here", ps)["title"] == "Bo Rann"
    assert focus_passage("q", []) is None
    assert question_entities("Who was born first, Ada Vell or Bo Rann?") == ["Ada Vell", "Bo Rann"]


def test_search_candidate_then_answer_candidate_solves_a_two_hop_question():
    env = make()
    _, info = env.reset(options={"question_id": "q1"})
    assert env.action_space == gym.spaces.Discrete(14)
    _, _, _, _, info = env.step(M["SEARCH_QUESTION"])
    assert info["query"] == "In which country is the birthplace of Ada Vell?"
    assert env.focus()["id"] == "ada"
    assert env.focus_candidates() == ["painter", "1901", "Orrin", "Kestrel Guild"]
    # "search an entity from the last passage": candidate 3 of Ada Vell's passage is Orrin
    _, reward, terminated, _, info = env.step(M["SEARCH_CANDIDATE_3"])
    assert (info["macro"], info["macro_text"], info["query"]) == (
        "SEARCH_CANDIDATE_3",
        "Orrin",
        "Orrin",
    )
    assert info["retrieved_ids"][0] == "orrin" and env.focus()["id"] == "orrin"
    assert (reward, terminated, info["macro_ok"]) == (0.0, False, True)
    _, reward, terminated, _, info = env.step(M["ANSWER_CANDIDATE_2"])
    assert (info["prediction"], reward, terminated) == ("Tamaria", 1.0, True)


def test_wrong_candidate_answers_wrong():
    env = make()
    env.reset(options={"question_id": "q1"})
    env.step(M["SEARCH_QUESTION"])
    _, reward, terminated, _, info = env.step(M["ANSWER_CANDIDATE_3"])
    assert (info["prediction"], reward, terminated) == ("Orrin", 0.0, True)


def test_answer_earliest_compares_the_question_entities():
    env = make()
    env.reset(options={"question_id": "q2"})
    assert env.earliest() is None and not env.action_masks()[M["ANSWER_EARLIEST"]]
    env.step(M["SEARCH_QUESTION"])
    assert env.earliest() == "Bo Rann"  # 1790 before 1901
    _, reward, terminated, _, info = env.step(M["ANSWER_EARLIEST"])
    assert (info["prediction"], reward, terminated) == ("Bo Rann", 1.0, True)


def test_backtrack_returns_the_focus_and_refuse_scores_unanswerable():
    env = make()
    env.reset(options={"question_id": "q1"})
    env.step(M["SEARCH_QUESTION"])
    env.step(M["SEARCH_CANDIDATE_4"])  # Kestrel Guild
    assert env.focus()["id"] == "guild"
    _, _, _, _, info = env.step(M["BACKTRACK"])
    assert info["action_type"] == "BACKTRACK" and env.focus()["id"] == "ada"
    env.reset(options={"question_id": "q3"})
    _, reward, terminated, _, info = env.step(M["REFUSE"])
    assert (info["action_type"], reward, terminated) == ("REFUSE", 1.0, True)


def test_inapplicable_macro_is_an_invalid_step_that_the_episode_survives():
    env = make()
    _, info = env.reset(options={"question_id": "q1"})
    mask = info["macro_mask"]
    assert mask.dtype == np.int8 and mask.tolist() == [1] + [0] * 11 + [0, 1]
    for name, why in [
        ("SEARCH_CANDIDATE_1", "no search yet"),
        ("ANSWER_EARLIEST", "fewer than two names"),
        ("BACKTRACK", "no search to drop"),
    ]:
        _, reward, terminated, truncated, info = env.step(M[name])
        assert info["invalid_action"] and not info["macro_ok"] and info["macro"] == name
        assert why in info["macro_message"]
        assert (reward, terminated, truncated) == (0.0, False, False)
    env.step(M["SEARCH_QUESTION"])
    _, _, terminated, _, info = env.step(M["SEARCH_CANDIDATE_5"])  # Ada Vell's passage has 4
    assert info["invalid_action"] and "has 4 candidates" in info["macro_message"]
    assert info["step"] == 5 and not terminated


@pytest.mark.parametrize("action", [14, -1, np.int64(99), np.array(1000)])
def test_out_of_range_action_is_an_invalid_step(action):
    env = make()
    env.reset(options={"question_id": "q1"})
    _, reward, terminated, _, info = env.step(action)
    assert info["macro"] == "OUT_OF_RANGE" and info["invalid_action"]
    assert "outside 0..13" in info["macro_message"] and (reward, terminated) == (0.0, False)
    _, _, _, _, info = env.step(M["SEARCH_QUESTION"])  # the episode goes on
    assert info["macro_ok"] and info["num_searches"] == 1


def test_numpy_indices_are_accepted():
    env = make()
    env.reset(options={"question_id": "q1"})
    _, _, _, _, info = env.step(np.array([0]))
    assert info["macro"] == "SEARCH_QUESTION"
    _, _, _, _, info = env.step(np.array(3, dtype=np.int32))
    assert info["macro_text"] == "Orrin"


@pytest.mark.parametrize("action", [1.5, "0", None, True, np.array([0, 1])])
def test_non_integer_action_raises_type_error(action):
    env = make()
    env.reset(options={"question_id": "q1"})
    with pytest.raises(TypeError, match=r"expected (the macro index to be an int|one macro index)"):
        env.step(action)


def test_constructor_errors():
    with pytest.raises(ValueError, match=r"expected n_candidates in 1..20, got 0"):
        make(n_candidates=0)
    with pytest.raises(TypeError, match="expected n_candidates to be an int"):
        make(n_candidates="3")
    with pytest.raises(ValueError, match="MacroActions needs a SearchEnv, got TreeSearchEnv"):
        MacroActions(gym.make("rag_gym/SynthHop-Tree-v0", dataset_kwargs=SMALL_WORLD))


def test_n_candidates_sizes_the_action_space_and_is_in_the_spec():
    env = MacroActions(gym.make("rag_gym/SynthHop-v0", dataset_kwargs=SMALL_WORLD), n_candidates=3)
    assert env.action_space == gym.spaces.Discrete(10)
    assert env.macro_names[4] == "ANSWER_CANDIDATE_1"
    assert env.spec.additional_wrappers[-1].kwargs == {"n_candidates": 3}


@pytest.mark.filterwarnings("ignore:.*different from the unwrapped")
def test_check_env_and_seeded_determinism_on_synthhop():
    env = MacroActions(gym.make("rag_gym/SynthHop-v0", dataset_kwargs=SMALL_WORLD))
    check_env(env.unwrapped)
    check_env(env, skip_render_check=True)

    def rollout(seed):
        rng = np.random.default_rng(seed)
        env.reset(seed=seed)
        out = []
        for _ in range(50):
            obs, reward, terminated, truncated, info = env.step(int(rng.integers(-2, 16)))
            out.append((obs, reward, info["macro"], info["macro_text"]))
            if terminated or truncated:
                env.reset()
        return out

    assert rollout(3) == rollout(3)

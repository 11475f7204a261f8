"""SearchEnv behaviour on a hand-made world where every outcome can be computed by hand."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import rag_gym  # noqa: F401
from rag_gym.data import Corpus, Passage, QAExample
from rag_gym.envs import ActionType, SearchEnv
from rag_gym.retrieval import BM25Retriever
from tests.conftest import SMALL_WORLD, shared_file

S, A, B, R, E = (
    ActionType.SEARCH,
    ActionType.ANSWER,
    ActionType.BACKTRACK,
    ActionType.REFUSE,
    ActionType.EVALUATE,
)

PASSAGES = [
    Passage(
        "p1", "Ada Vell", "Ada Vell is a painter born in Orrin. Ada Vell works for Kestrel Guild."
    ),
    Passage("p2", "Orrin", "Orrin is a city in Tamaria, founded in 900."),
    Passage("p3", "Tamaria", "Tamaria is a country whose capital is Lusk."),
    Passage("p4", "Kestrel Guild", "Kestrel Guild is a craft guild founded in 1700 by Bo Rann."),
    Passage("p5", "Bo Rann", "Bo Rann is a weaver born in Lusk."),
]
QUESTIONS = [
    QAExample(
        "q1",
        "In which country is the birthplace of Ada Vell?",
        ("Tamaria", "Republic of Tamaria"),
        ("p1", "p2"),
        hops=2,
    ),
    QAExample(
        "q2",
        "Where was the founder of Zorn Academy born?",
        ("Ebbin",),
        ("p4",),
        hops=2,
        answerable=False,
    ),
]


def make_env(**kwargs) -> SearchEnv:
    corpus = Corpus(PASSAGES)
    return SearchEnv(examples=QUESTIONS, retriever=BM25Retriever(corpus), **{"k": 2, **kwargs})


def act(atype, text=""):
    return {"type": atype, "text": text}


def test_search_appends_passages_and_info():
    env = make_env()
    obs, info = env.reset(options={"question_id": "q1"})
    assert obs == "Question: In which country is the birthplace of Ada Vell?"
    assert info["step"] == 0 and info["gold_ids"] == ["p1", "p2"] and info["action_type"] is None
    assert info["action_mask"].tolist() == [1, 1, 0, 1, 1]
    obs, reward, term, trunc, info = env.step(act(S, "Ada Vell birthplace"))
    assert (reward, term, trunc) == (0.0, False, False)
    assert info["retrieved_ids"][0] == "p1" and info["gold_hits"][0] == "p1"
    assert (
        info["query"] == "Ada Vell birthplace" and info["num_searches"] == 1 and info["step"] == 1
    )
    assert (
        "[1] Search: Ada Vell birthplace\n  (1) Ada Vell: Ada Vell is a painter born in Orrin."
        in obs
    )
    obs, _, _, _, info = env.step(act(S, "Orrin city country"))
    assert info["retrieved_ids"][0] == "p2" and info["gold_found"] == ["p1", "p2"]
    assert len(info["context_ids"]) == 2 and info["action_mask"].tolist() == [1, 1, 1, 1, 1]
    assert info["reward_terms"] == {"answer": 0.0, "invalid": 0.0}


def test_evaluate_and_backtrack():
    env = make_env()
    env.reset(options={"question_index": 0})
    env.step(act(S, "Ada Vell"))
    env.step(act(S, "Kestrel Guild founder"))
    obs, _, _, _, info = env.step(act(E, "The guild is irrelevant."))
    assert "[3] Evaluation: The guild is irrelevant." in obs
    obs, reward, term, _, info = env.step(act(B))
    # the latest search and the note after it are dropped from the context
    assert "Kestrel Guild founder" not in obs.split("Note:")[0] and "irrelevant" not in obs
    assert 'Note: Backtracked: dropped the search "Kestrel Guild founder" (step 2).' in obs
    assert info["context_ids"] == [info["retrieved_history"][:2]]
    assert "p4" in info["retrieved_history"]  # still in the episode history
    assert (reward, term, info["invalid_action"]) == (0.0, False, False)
    env.step(act(B))
    _, _, _, _, info = env.step(act(B))  # nothing left to drop
    assert info["invalid_action"] and "BACKTRACK needs a search" in info["message"]
    assert info["action_mask"][ActionType.BACKTRACK] == 0


@pytest.mark.parametrize(
    ("metric", "answer", "expected"),
    [
        ("em", "the Tamaria", 1.0),
        ("em", "Tamaria city", 0.0),
        ("f1", "Tamaria city", 2 / 3),
        ("em_f1", "Tamaria city", 1 / 3),
        ("em", "republic of tamaria", 1.0),
    ],
)
def test_answer_reward(metric, answer, expected):
    env = make_env(answer_metric=metric)
    env.reset(options={"question_id": "q1"})
    _, reward, term, trunc, info = env.step(act(A, answer))
    assert reward == pytest.approx(expected) and term and not trunc
    assert info["prediction"] == answer and info["reward_terms"]["answer"] == pytest.approx(
        expected
    )


def test_refusal_rewards():
    env = make_env()
    env.reset(options={"question_id": "q1"})
    assert env.step(act(R))[1] == 0.0  # answerable: refusing is wrong
    env.reset(options={"question_id": "q2"})
    _, reward, term, _, info = env.step(act(R))
    assert reward == 1.0 and term and info["answerable"] is False
    env.reset(options={"question_id": "q2"})
    assert env.step(act(A, "Ebbin"))[1] == 0.0  # answering an unanswerable question scores 0


@pytest.mark.parametrize(
    ("action", "message"),
    [
        (act(S, "   "), "SEARCH needs a non-empty query"),
        (act(S, "x" * 513), "the query has 513 characters; the limit is 512"),
        (act(A, ""), "ANSWER needs a non-empty answer"),
        (act(E, ""), "EVALUATE needs a non-empty note"),
        (act(B), "BACKTRACK needs a search"),
    ],
)
def test_meaningless_actions_do_not_crash(action, message):
    env = make_env(invalid_action_penalty=-0.5)
    env.reset(options={"question_index": 0})
    obs, reward, term, trunc, info = env.step(action)
    assert (
        info["invalid_action"]
        and message in info["message"]
        and f"Note: Invalid action: {message}" in obs
    )
    assert reward == -0.5 and info["reward_terms"]["invalid"] == -0.5
    assert not term and not trunc and info["step"] == 1
    _, _, term, _, _ = env.step(act(A, "Tamaria"))  # the episode goes on
    assert term


@pytest.mark.parametrize(
    ("action", "error", "match"),
    [
        ("SEARCH x", TypeError, "expected an action dict"),
        ({"type": S}, ValueError, r"expected action keys \{'type', 'text'\}"),
        ({"type": "SEARCH", "text": "x"}, TypeError, "expected action\\['type'\\] to be an int"),
        ({"type": 7, "text": "x"}, ValueError, r"expected action\['type'\] in 0..4"),
        ({"type": S, "text": 3}, TypeError, r"expected action\['text'\] to be a str"),
        ({"type": S, "text": "a\x00b"}, ValueError, "printable Unicode, got character '\\\\x00'"),
        ({"type": S, "text": "x" * 5000}, ValueError, "at most 4096 characters, got 5000"),
    ],
)
def test_actions_outside_the_space_raise(action, error, match):
    env = make_env()
    env.reset(options={"question_index": 0})
    assert not env.action_space.contains(action)
    with pytest.raises(error, match=match):
        env.step(action)


def test_numpy_action_type_accepted():
    env = make_env()
    env.reset(options={"question_index": 0})
    action = {"type": np.int64(0), "text": "Ada"}
    assert env.action_space.contains(action)
    assert env.step(action)[4]["action_type"] == "SEARCH"


def test_lifecycle_errors():
    env = make_env()
    with pytest.raises(RuntimeError, match=r"call reset\(\) before step\(\)"):
        env.step(act(S, "x"))
    env.reset(options={"question_index": 0})
    env.step(act(R))
    with pytest.raises(RuntimeError, match="the episode has ended"):
        env.step(act(S, "x"))
    with pytest.raises(ValueError, match=r"expected options\['question_index'\] in \[0, 2\)"):
        env.reset(options={"question_index": 5})
    with pytest.raises(ValueError, match="no question with id 'zz'"):
        env.reset(options={"question_id": "zz"})


def test_truncation_at_20_steps():
    env = gym.make(
        "rag_gym/SynthHop-v0", dataset_kwargs={"n_passages": 2000, "n_questions": [60, 30, 30]}
    )
    env.reset(seed=0)
    for t in range(1, 21):
        _, reward, term, trunc, info = env.step(act(E, "thinking"))
        assert reward == 0.0 and not term
        assert trunc == (t == 20) and info["step"] == t


def test_observation_clipping_keeps_question_and_newest():
    env = make_env(max_obs_chars=300)
    obs, _ = env.reset(options={"question_index": 0})
    for q in ["Ada Vell", "Orrin", "Tamaria", "Kestrel", "Bo Rann"]:
        obs, *_ = env.step(act(S, q))
        assert len(obs) <= 300 and env.observation_space.contains(obs)
    assert obs.startswith("Question: In which country")
    assert "[... earlier context clipped ...]" in obs and "Search: Bo Rann" in obs


def test_observation_is_rendered_incrementally_as_from_scratch():
    """The context is rendered once per hop and extended step by step; after any mix of
    searches, notes, backtracks and invalid actions the observation is the whole context
    rendered afresh."""
    from rag_gym.envs.spaces import sanitize

    rng = np.random.default_rng(0)
    for max_obs_chars in (300, 16384):
        env = make_env(max_obs_chars=max_obs_chars)
        env.reset(options={"question_index": 0})
        for _ in range(80):
            kind = int(rng.choice([S, S, S, E, B]))
            obs, *_ = env.step(act(kind, str(rng.choice(["Ada Vell", "Orrin", "", "Bo Rann"]))))
            env._body = (0, "")  # forget the rendered context: render every hop again
            assert obs == env._render_obs()
            if max_obs_chars == 16384:
                blocks = [env._block(n, hop) for n, hop in enumerate(env._context, 1)]
                if env._last_message:
                    blocks.append(sanitize(f"Note: {env._last_message}"))
                assert obs == "\n\n".join([f"Question: {QUESTIONS[0].question}", *blocks])


def test_exclude_seen():
    env = make_env(exclude_seen=True)
    env.reset(options={"question_index": 0})
    first = env.step(act(S, "Ada Vell Orrin"))[4]["retrieved_ids"]
    second = env.step(act(S, "Ada Vell Orrin"))[4]["retrieved_ids"]
    assert not set(first) & set(second)


def test_observation_is_sanitised():
    corpus = Corpus([Passage("x", "Bell\x07", "Text with a bell\x07 and emoji \U0001f600.")])
    q = QAExample("q", "Who?", ("Vell",), ("x",))
    env = SearchEnv(examples=[q], retriever=BM25Retriever(corpus), k=1)
    env.reset()
    obs = env.step(act(S, "text"))[0]
    assert env.observation_space.contains(obs) and "\ufffd" in obs


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"k": 0}, ValueError, "expected k >= 1"),
        ({"k": "3"}, TypeError, "expected k to be an int"),
        ({"answer_metric": "acc"}, ValueError, "expected answer_metric in"),
        ({"corpus_mode": "full"}, ValueError, "expected corpus_mode 'pool', 'corpus' or None"),
        ({"render_mode": "rgb_array"}, ValueError, "expected render_mode in"),
        ({"invalid_action_penalty": float("nan")}, ValueError, "expected a finite invalid_action"),
        ({"invalid_action_penalty": -float("inf")}, ValueError, "expected a finite invalid_action"),
        ({"invalid_action_penalty": True}, TypeError, "expected invalid_action_penalty to be a"),
    ],
)
def test_constructor_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        make_env(**kwargs)


def test_render_ansi():
    env = make_env(render_mode="ansi")
    env.reset(options={"question_index": 0})
    env.step(act(S, "Ada"))
    assert env.render().startswith("Question: In which country")


@pytest.mark.shared_data
def test_bamboogle_needs_a_corpus():
    with pytest.raises(
        ValueError, match=r"give a corpus to search, as corpus='path/to/corpus\.jsonl'"
    ):
        gym.make("rag_gym/Bamboogle-v0", data_path=str(shared_file("bamboogle/bamboogle.jsonl")))


@pytest.mark.shared_data
def test_pool_mode_searches_only_the_question_pool():
    env = gym.make(
        "rag_gym/HotpotQA-v0", data_path=str(shared_file("hotpotqa/hotpot_dev_distractor_300.json"))
    )
    for seed in range(5):
        _, info = env.reset(seed=seed)
        pool = {
            p.id for p in env.unwrapped.examples[env.unwrapped._by_id[info["question_id"]]].passages
        }
        _, _, _, _, info = env.step(act(S, info["question"]))
        assert len(info["retrieved_ids"]) == 3 and set(info["retrieved_ids"]) <= pool


@pytest.mark.parametrize(
    ("seed", "error", "match"),
    [(-1, ValueError, r"expected seed >= 0 or None, got -1"), (1.5, TypeError, "expected seed")],
)
def test_a_bad_seed_is_a_typed_error(seed, error, match):
    env = make_env()
    with pytest.raises(error, match=match):
        env.reset(seed=seed)
    wrapped = gym.make(
        "rag_gym/SynthHop-v0", dataset_kwargs={"n_passages": 2000, "n_questions": [40, 10, 10]}
    )
    with pytest.raises(error, match=match):
        wrapped.reset(seed=seed)
    assert env.reset(seed=np.int64(3))[1]["step"] == 0


def test_k_above_the_candidates_returns_every_candidate():
    env = make_env(k=50)
    _, info = env.reset(options={"question_id": "q1"})
    _, _, _, _, info = env.step(act(S, "Ada Vell"))
    assert len(info["retrieved_ids"]) == len(PASSAGES) == len(set(info["retrieved_ids"]))
    pool = (PASSAGES[0], PASSAGES[1], PASSAGES[0])  # a pool naming one passage twice
    q = QAExample("qp", "Where was Ada Vell born?", ("Orrin",), ("p1", "p2"), pool, hops=2)
    env = SearchEnv(
        examples=[q], retriever=BM25Retriever(Corpus(PASSAGES)), corpus_mode="pool", k=5
    )
    env.reset()
    _, _, _, _, info = env.step(act(S, "Ada Vell"))
    assert sorted(info["retrieved_ids"]) == ["p1", "p2"]


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ("index", TypeError, r"expected options to be a dict or None, got str: 'index'"),
        ([("index", 0)], TypeError, r"expected options to be a dict or None, got list"),
        ({"question_id": ["q1"]}, TypeError, r"options\['question_id'\] to be a str.*got list"),
        ({"question_id": 1}, TypeError, r"options\['question_id'\] to be a str.*got int: 1"),
        ({"question_id": None}, TypeError, r"options\['question_id'\] to be a str.*NoneType"),
        (
            {"question_index": True},
            TypeError,
            r"options\['question_index'\] to be an int.*got bool: True",
        ),
        (
            {"question_index": np.bool_(False)},
            TypeError,
            r"options\['question_index'\] to be an int.*got bool",
        ),
        (
            {"question_index": 1.0},
            TypeError,
            r"options\['question_index'\] to be an int.*got float: 1\.0",
        ),
        (
            {"question_index": "1"},
            TypeError,
            r"options\['question_index'\] to be an int.*got str: '1'",
        ),
        (
            {"question_index": None},
            TypeError,
            r"options\['question_index'\] to be an int.*got NoneType",
        ),
        (
            {"question_index": -1},
            ValueError,
            r"expected options\['question_index'\] in \[0, 2\), got -1",
        ),
        (
            {"question_index": 2},
            ValueError,
            r"expected options\['question_index'\] in \[0, 2\), got 2",
        ),
        (
            {"question_index": 0, "question_id": "q2"},
            ValueError,
            r"question_id'\] or .*'question_index'\], got both",
        ),
        (
            {"question_index": 0, "index": 0},
            ValueError,
            r"'question_index'\], got it and options\['index'\]",
        ),
    ],
)
def test_bad_reset_options_are_typed_errors(options, error, match):
    env = make_env()
    with pytest.raises(error, match=match):
        env.reset(options=options)
    # the good forms: an int (numpy's too), a question id, a read-only mapping
    from types import MappingProxyType

    assert env.reset(options={"question_index": np.int64(1)})[1]["question_id"] == "q2"
    assert env.reset(options=MappingProxyType({"question_id": "q1"}))[1]["question_id"] == "q1"


def test_the_former_index_option_still_picks_the_question_with_a_deprecation_warning():
    env = make_env()
    with pytest.warns(DeprecationWarning, match="options=\\{'question_index': i\\}"):
        _, info = env.reset(options={"index": 1})
    assert info["question_id"] == "q2"
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="got both"):
        env.reset(options={"index": 1, "question_id": "q1"})


def test_tree_context_ids_must_be_a_list_of_ids():
    from rag_gym.envs import TreeSearchEnv

    env = TreeSearchEnv(examples=QUESTIONS, retriever=BM25Retriever(Corpus(PASSAGES)))
    with pytest.raises(TypeError, match=r"options\['context_ids'\] to be a list of passage ids"):
        env.reset(options={"question_index": 0, "context_ids": "p1"})
    with pytest.raises(TypeError, match=r"expected options to be a dict or None, got str"):
        env.reset(options="index")
    assert env.reset(options={"question_index": 0, "context_ids": ["p1"]})[1]["question_id"] == "q1"


def test_pickle_and_deepcopy_say_what_holds_the_module_and_what_to_do():
    import copy
    import pickle

    env = gym.make("rag_gym/SynthHop-v0", dataset_kwargs=SMALL_WORLD)
    message = (
        r"a SearchEnv cannot be {}: its retriever \(BM25Retriever\) holds the modules bm25s and "
        r"rag_gym\.retrieval\._bm25_numba \(its search backend\).*Make another env instead: "
        r"gym\.make\(env\.spec\) .*rag_gym/SynthHop-v0"
    )
    with pytest.raises(TypeError, match=message.format("pickled")):
        pickle.dumps(env)
    with pytest.raises(TypeError, match=message.format("deep-copied")):
        copy.deepcopy(env)
    # what the message proposes works, in this process and through a pickle of the spec
    again = gym.make(pickle.loads(pickle.dumps(env.spec)))
    assert again.unwrapped.examples == env.unwrapped.examples
    assert copy.copy(env.unwrapped).retriever is env.unwrapped.retriever  # a shallow copy
    plain = make_env()  # no spec: built directly
    with pytest.raises(TypeError, match=r"build another SearchEnv with the same arguments"):
        pickle.dumps(plain)
    env.close()
    again.close()


@pytest.mark.parametrize("split", ["nosuch", "Dev", ""])
def test_an_unknown_split_is_refused_at_construction(split):
    with pytest.raises(ValueError, match=rf"expected a split in \[.*\], got {split!r}"):
        make_env(split=split)
    with pytest.raises(ValueError, match=rf"expected a split in \[.*\], got {split!r}"):
        gym.make("rag_gym/SynthHop-v0", dataset_kwargs=SMALL_WORLD, split=split)
    assert make_env(split="dev").split == "dev"

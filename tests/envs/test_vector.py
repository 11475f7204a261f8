"""gym.make_vec works for every env kind, sync and async, and both modes agree."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import rag_gym  # noqa: F401
from rag_gym.envs import ReaderEnv, TreeSearchEnv
from rag_gym.envs.spaces import UnicodeText
from rag_gym.retrieval import BM25Retriever
from tests.conftest import SMALL_WORLD, first_fast

KW = {"dataset_kwargs": SMALL_WORLD}


def actions(kind: str, n: int, t: int):
    if kind == "search":
        types = np.array([(t + j) % 2 * 4 for j in range(n)])  # SEARCH (0) and EVALUATE (4)
        return {"type": types, "text": tuple(f"query {t} {j}" for j in range(n))}
    if kind == "tree":
        return tuple(TreeSearchEnv.format_action("t", base=[f"Question {t} {j}"]) for j in range(n))
    return tuple(ReaderEnv.format_action([1, 2], "a", "x") for _ in range(n))


@pytest.mark.parametrize(
    "kind,env_id",
    first_fast(
        [
            ("search", "rag_gym/SynthHop-v0"),
            ("tree", "rag_gym/SynthHop-Tree-v0"),
            ("reader", "rag_gym/SynthHop-Reader-v0"),
        ]
    ),
)
def test_sync_and_async_agree(kind, env_id):
    traces = {}
    for mode in ("sync", "async"):
        venv = gym.make_vec(env_id, num_envs=3, vectorization_mode=mode, **KW)
        obs, _ = venv.reset(seed=7)
        trace = [obs]
        for t in range(6):
            obs, reward, term, trunc, _ = venv.step(actions(kind, 3, t))
            assert isinstance(obs, tuple) and all(isinstance(o, str) for o in obs)
            assert all(venv.single_observation_space.contains(o) for o in obs)
            trace.append((obs, reward.tolist(), term.tolist(), trunc.tolist()))
        venv.close()
        traces[mode] = trace
    assert traces["sync"] == traces["async"]
    assert traces["sync"][0][0].startswith(("Question:", "Answer the question", "You are given"))


def test_sync_copies_share_one_index():
    venv = gym.make_vec("rag_gym/SynthHop-v0", num_envs=3, vectorization_mode="sync", **KW)
    retrievers = {id(e.unwrapped.retriever) for e in venv.envs}
    corpora = {id(e.unwrapped.corpus) for e in venv.envs}
    venv.close()
    assert len(retrievers) == 1 and len(corpora) == 1


def test_async_workers_memory_map_a_saved_index(tmp_path):
    from rag_gym.data.synthhop import world_for

    BM25Retriever(world_for(**SMALL_WORLD).corpus).save(tmp_path / "idx")
    venv = gym.make_vec(
        "rag_gym/SynthHop-v0",
        num_envs=2,
        vectorization_mode="async",
        index=str(tmp_path / "idx"),
        **KW,
    )
    _, info = venv.reset(seed=0)
    questions, qids = list(info["question"]), list(info["question_id"])
    _, _, _, _, info = venv.step({"type": np.array([0, 0]), "text": tuple(questions)})
    venv.close()
    # the same searches in one env that built its own index in memory give the same passages
    env = gym.make("rag_gym/SynthHop-v0", **KW)
    for j in range(2):
        env.reset(options={"question_id": qids[j]})
        _, _, _, _, single = env.step({"type": 0, "text": questions[j]})
        assert list(info["retrieved_ids"][j]) == single["retrieved_ids"]


def test_shared_text_view_decodes_current_memory():
    from gymnasium.vector.utils import (
        create_shared_memory,
        read_from_shared_memory,
        write_to_shared_memory,
    )

    space = UnicodeText(32)
    memory = create_shared_memory(space, n=2)
    view = read_from_shared_memory(space, memory, n=2)
    write_to_shared_memory(space, 0, "first", memory)
    write_to_shared_memory(space, 1, "é 漢\n", memory)
    import copy

    assert copy.deepcopy(view) == ("first", "é 漢\n")
    write_to_shared_memory(space, 0, "second", memory)
    assert view[0] == "second" and len(view) == 2 and view[-1] == "é 漢\n"


def _canon(x) -> str:
    import json

    return json.dumps(
        x,
        sort_keys=True,
        default=lambda o: o.tolist() if isinstance(o, np.ndarray) else repr(o),
    )


def _random_actions(rng: np.random.Generator, info: dict, n: int, t: int) -> dict:
    """A mix of every action type: searches of the question's words, notes, backtracks,
    answers, refusals, and invalid (empty) ones."""
    types, texts = [], []
    for j in range(n):
        question = str(info["question"][j]) if "question" in info else "x"
        words = question.split() or ["x"]
        kind = int(rng.choice([0, 0, 0, 4, 2, 1, 3]))
        text = " ".join(words[int(i)] for i in rng.integers(0, len(words), size=3))
        if rng.random() < 0.1:
            text = ""  # an invalid SEARCH / EVALUATE / ANSWER
        types.append(kind)
        texts.append(text)
    return {"type": np.array(types, dtype=np.int64), "text": tuple(texts)}


@pytest.mark.parametrize(
    "extra",
    [{}, {"corpus_mode": "pool", "exclude_seen": True, "k": 4}],
    ids=["corpus", "pool-exclude"],
)
def test_native_vector_env_matches_sync_episode_for_episode(extra):
    n, steps = 4, 40
    kwargs = {**KW, **extra, "max_episode_steps": 5}
    runs = {}
    for mode in ("sync", "vector_entry_point"):
        venv = gym.make_vec("rag_gym/SynthHop-v0", num_envs=n, vectorization_mode=mode, **kwargs)
        rng = np.random.default_rng(0)
        obs, info = venv.reset(seed=11)
        trace = [_canon([obs, info])]
        for t in range(steps):
            obs, reward, term, trunc, info = venv.step(_random_actions(rng, info, n, t))
            trace.append(_canon([obs, reward, term, trunc, info]))
        venv.close()
        runs[mode] = trace
    for t, (sync, native) in enumerate(zip(runs["sync"], runs["vector_entry_point"], strict=True)):
        assert sync == native, f"step {t} differs"
    # the rollout ended episodes each way, and the autoreset step followed
    import json

    ends = [json.loads(s) for s in runs["sync"][1:]]
    assert any(any(e[2]) for e in ends) and any(any(e[3]) for e in ends)


def test_native_vector_env_batches_one_retrieve_per_step():
    n = 5
    venv = gym.make_vec(
        "rag_gym/SynthHop-v0", num_envs=n, vectorization_mode="vector_entry_point", **KW
    )
    retriever = venv.unwrapped.envs[0].retriever
    assert all(e.retriever is retriever for e in venv.unwrapped.envs)  # one shared index
    calls = []
    original = retriever.retrieve

    def counting(queries, k, exclude=None, within=None):
        calls.append(len(queries))
        return original(queries, k, exclude=exclude, within=within)

    retriever.retrieve = counting
    try:
        _, info = venv.reset(seed=0)
        types = np.array([0, 0, 4, 0, 0])  # four searches and a note
        _, _, _, _, info = venv.step({"type": types, "text": tuple(info["question"])})
        assert calls == [4]
        assert [len(ids) for ids in info["retrieved_ids"]] == [3, 3, 0, 3, 3]
    finally:
        retriever.retrieve = original
        venv.close()
    assert venv.metadata["autoreset_mode"] == gym.vector.AutoresetMode.NEXT_STEP
    assert venv.spec.kwargs["vectorization_mode"] == "vector_entry_point"


def test_native_vector_env_errors_name_the_fix():
    from rag_gym.envs.vector import SearchVectorEnv

    with pytest.raises(ValueError, match="expected num_envs >= 1, got 0"):
        SearchVectorEnv(0, **KW)
    with pytest.raises(TypeError, match="reward_preset= is not an env argument"):
        gym.make_vec(
            "rag_gym/SynthHop-v0",
            num_envs=2,
            vectorization_mode="vector_entry_point",
            reward_preset="eval_rar",
            **KW,
        )
    venv = SearchVectorEnv(2, **KW)
    with pytest.raises(ValueError, match="expected 2 seeds"):
        venv.reset(seed=[1, 2, 3])
    with pytest.raises(TypeError, match="reset_mask"):
        venv.reset(options={"reset_mask": [True, False]})
    obs, _ = venv.reset(seed=0)
    again, _ = venv.reset(seed=5, options={"reset_mask": np.array([False, True])})
    assert again[0] == obs[0]  # only the masked sub-env was reset
    assert again[1] == SearchVectorEnv(2, **KW).reset(seed=5)[0][1]


def _same(got, expected) -> None:
    assert list(got) == list(expected)
    for key, want in expected.items():
        have = got[key]
        if isinstance(want, dict):
            _same(have, want)
            continue
        assert isinstance(have, np.ndarray) and have.dtype == want.dtype, key
        assert have.shape == want.shape, key
        for a, b in zip(have.tolist(), want.tolist(), strict=True):
            assert type(a) is type(b) and a == b, key


@pytest.mark.parametrize(
    "infos",
    [
        [  # every key in every info (a step without ANSWER/REFUSE)
            {
                "step": j,
                "ok": j == 1,
                "score": 0.5 * j,
                "ids": ["p1", "p2"],
                "query": None if j else "q",
                "mask": np.array([1, 0, j], dtype=np.int8),
                "np": np.float32(j),
                "terms": {"answer": 0.0, "invalid": float(j)},
            }
            for j in range(3)
        ],
        [{"a": 1, "t": {"x": 1}}, None, {"a": 2, "b": "x", "t": {"y": 2.0}}],  # keys differ
        [{"a": 1}, {"a": 2.5}, {"a": True}],  # one key, values of several types
        [{"a": 1.5}, {"a": 2}, {"a": np.float64(3)}],
        [{"a": "x", "b": 1}, {"b": 2, "a": "y"}, {"a": "z", "b": 3}],  # keys in another order
        [None, None, {"a": [1]}],
    ],
)
def test_batch_infos_match_gymnasium_add_info(infos):
    from rag_gym.envs.vector import SearchVectorEnv

    venv = SearchVectorEnv(3, **KW)
    expected: dict = {}
    for i, info in enumerate(infos):
        if info is not None:
            expected = venv._add_info(expected, info, i)
    _same(venv._batch_infos(infos), expected)


def test_native_vector_env_takes_actions_in_any_batched_form():
    """The usual batch (an int array, a tuple of strings) and the other forms Gymnasium's
    ``iterate`` takes step alike."""
    from rag_gym.envs.vector import SearchVectorEnv

    results = []
    for types, texts in [
        (np.array([0, 4]), ("Ada", "note")),
        ([0, 4], ["Ada", "note"]),
        (np.array([0, 4]), ["Ada", "note"]),
    ]:
        venv = SearchVectorEnv(2, **KW)
        venv.reset(seed=3)
        obs, reward, _, _, info = venv.step({"type": types, "text": texts})
        results.append((obs, reward.tolist(), _canon(info)))
    assert results[0] == results[1] == results[2]
    with pytest.raises(ValueError):
        venv.step({"type": np.array([0, 4, 0]), "text": ("a", "b", "c")})

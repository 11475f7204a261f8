"""Every registered id: Gymnasium's env checker and a 50-step seeded determinism rollout."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import rag_gym  # noqa: F401
from rag_gym.data import load, pooled_corpus
from rag_gym.envs import ActionType, ReaderEnv, TreeSearchEnv, env_ids
from tests.conftest import SMALL_WORLD, shared_file

REAL = {
    "HotpotQA": "hotpotqa/hotpot_dev_distractor_300.json",
    "2WikiMultiHopQA": "2wikimultihopqa/dev_250.json",
    "MuSiQue": "musique/musique_ans_dev_100.jsonl",
    "Bamboogle": "bamboogle/bamboogle.jsonl",
}


#: the open-domain sets: FlashRAG JSONL questions over a corpus of their own
OPEN = ("NQ", "TriviaQA", "PopQA")


def flashrag_fixture(tmp_path_factory) -> dict:
    """A FlashRAG-format question file (``{id, question, golden_answers}``) and the corpus that
    answers it, written from the small SynthHop world: ``data_path=`` and ``corpus=``."""
    from rag_gym.data.synthhop import world_for

    world = world_for(**SMALL_WORLD)
    folder = tmp_path_factory.mktemp("flashrag")
    rows = [
        {"id": ex.id, "question": ex.question, "golden_answers": list(ex.answers)}
        for ex in world.questions["test"]
    ]
    (folder / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    world.corpus.to_jsonl(folder / "corpus.jsonl")
    return {"data_path": str(folder / "test.jsonl"), "corpus": str(folder / "corpus.jsonl")}


def make_kwargs(env_id: str, tmp_path_factory) -> dict:
    stem = env_id.split("/")[1].split("-")[0]
    if stem in OPEN:
        return flashrag_fixture(tmp_path_factory)
    if stem == "SynthHop":
        preset = "hard" if "-Hard-" in env_id else "default"
        return {"dataset_kwargs": {"preset": preset, **SMALL_WORLD}}
    kwargs = {"data_path": str(shared_file(REAL[stem]))}
    if stem == "Bamboogle":
        # Bamboogle has no corpus: search the HotpotQA sample's paragraphs (real Wikipedia text)
        corpus, _ = pooled_corpus(load("hotpotqa", path=shared_file(REAL["HotpotQA"])))
        path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
        corpus.to_jsonl(path)
        kwargs["corpus"] = str(path)
    return kwargs


def test_registry_is_complete():
    stems = ["SynthHop", "SynthHop-Hard", "HotpotQA", "2WikiMultiHopQA", "MuSiQue"]
    corpus_only = ["Bamboogle", *OPEN]
    assert env_ids("search") == [f"rag_gym/{s}-v0" for s in [*stems, *corpus_only]]
    assert env_ids("tree") == [f"rag_gym/{s}-Tree-v0" for s in [*stems, *corpus_only]]
    # Bamboogle and the open-domain sets have no passages of their own, so no reader env
    assert env_ids("reader") == [f"rag_gym/{s}-Reader-v0" for s in stems]
    steps = {"search": 20, "tree": 5, "reader": None}
    for kind, expected in steps.items():
        for env_id in env_ids(kind):
            spec = gym.spec(env_id)
            assert spec.max_episode_steps == expected
            assert gym.envs.registration.EnvSpec.from_json(spec.to_json()) == spec


def test_dataset_kwargs_extend_the_hard_world_instead_of_replacing_it():
    """Gymnasium merges gym.make's keyword arguments one level deep: the hard preset is in the
    registered dataset's name, so a smaller world of SynthHop-Hard is still the hard one."""
    from rag_gym.data import canonical_name, dataset_defaults

    assert gym.spec("rag_gym/SynthHop-Hard-v0").kwargs == {"dataset": "synthhop-hard"}
    assert (canonical_name("synthhop-hard"), dataset_defaults("SynthHop-Hard")) == (
        "synthhop",
        {"preset": "hard"},
    )

    def unanswerable(**dataset_kwargs):
        env = gym.make("rag_gym/SynthHop-Hard-v0", split="train", dataset_kwargs=dataset_kwargs)
        n = 0
        for i in range(SMALL_WORLD["n_questions"][0]):
            _, info = env.reset(options={"question_index": i})
            n += not info["answerable"]
        return n, env.unwrapped.dataset

    assert unanswerable(**SMALL_WORLD) == unanswerable(**SMALL_WORLD, preset="hard")
    assert unanswerable(**SMALL_WORLD)[0] > 0  # 10% of the hard world's questions
    assert unanswerable(**SMALL_WORLD, preset="default") == (0, "synthhop")  # named: it wins
    with pytest.raises(ValueError, match="did you mean 'synthhop-hard'"):
        dataset_defaults("synthhop-hrad")


@pytest.mark.parametrize("env_id", env_ids())
def test_check_env(env_id, tmp_path_factory):
    env = gym.make(env_id, **make_kwargs(env_id, tmp_path_factory))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any checker warning fails the test
        check_env(env.unwrapped)
    env.close()


def _words(rng: np.random.Generator, obs: str, n: int) -> str:
    words = re.findall(r"\w+", obs) or ["x"]
    return " ".join(words[int(i)] for i in rng.integers(0, len(words), size=n))


def _policy(rng: np.random.Generator, obs: str, info: dict, kind: str):
    if kind == "tree":
        if rng.random() < 0.15:
            return "no tags at all"
        base = [_words(rng, obs, 3) for _ in range(int(rng.integers(1, 4)))]
        return TreeSearchEnv.format_action(
            "t", base=base, predicted=[_words(rng, obs, 2)], stop=rng.random() < 0.2
        )
    if kind == "reader":
        refs = sorted({int(i) for i in rng.integers(1, 11, size=int(rng.integers(0, 4)))})
        return ReaderEnv.format_action(refs, "because", _words(rng, obs, 2))
    words = re.findall(r"\w+", obs) or ["x"]
    atype = int(rng.choice(np.flatnonzero(info["action_mask"]), p=None))
    if atype in (ActionType.ANSWER, ActionType.REFUSE) and rng.random() < 0.7:
        atype = ActionType.SEARCH  # keep episodes going for longer
    n = int(rng.integers(0, 5))
    text = " ".join(words[int(i)] for i in rng.integers(0, len(words), size=n))
    return {"type": atype, "text": text}


def _rollout(env_id: str, kwargs: dict, steps: int = 50) -> list:
    env = gym.make(env_id, **kwargs)
    kind = next(k for k in ("tree", "reader", "search") if env_id in env_ids(k))
    rng = np.random.default_rng(123)
    obs, info = env.reset(seed=42)
    trace = [("reset", obs, info)]
    episode = 0
    for _ in range(steps):
        obs, reward, terminated, truncated, info = env.step(_policy(rng, obs, info, kind))
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
    steps = [t[4] for t in first if t[0] != "reset"]
    if env_id in env_ids("search"):
        assert any(info["retrieved_ids"] for info in steps)
    elif env_id in env_ids("tree"):
        assert any(info["branches"] for info in steps)
    else:
        assert any(info["prediction"] for info in steps)
    assert any(t[0] == "reset" for t in first[1:])


def test_registered_entry_points_are_the_env_classes():
    from rag_gym.envs import SearchEnv

    kinds = {"search": SearchEnv, "tree": TreeSearchEnv, "reader": ReaderEnv}
    for kind, cls in kinds.items():
        for env_id in env_ids(kind):
            entry = gym.spec(env_id).entry_point
            assert entry == f"{cls.__module__}:{cls.__name__}"
    env = gym.make("rag_gym/SynthHop-v0", max_episode_steps=2, dataset_kwargs=SMALL_WORLD)
    assert type(env.unwrapped) is SearchEnv and env.spec.max_episode_steps == 2
    env.reset(seed=0)
    ends = [env.step({"type": ActionType.EVALUATE, "text": "x"})[3] for _ in range(2)]
    assert ends == [False, True]
    # the spec's kwargs build the same env again
    again = gym.make(env.spec)
    assert again.spec == env.spec
    assert again.reset(seed=3)[0] == env.reset(seed=3)[0]


def test_data_config_is_shared_by_every_env_class():
    from rag_gym.envs import DataConfig, SearchEnv

    data = DataConfig(dataset_kwargs=SMALL_WORLD, split="validation")
    by_config = SearchEnv(data, k=2)
    by_keywords = SearchEnv(dataset_kwargs=SMALL_WORLD, split="validation", k=2)
    assert by_config.data == by_keywords.data == data
    assert by_config.reset(seed=5)[0] == by_keywords.reset(seed=5)[0]
    tree = TreeSearchEnv(data, split="train")  # a keyword replaces that field of data=
    assert tree.split == "train" and tree.data.dataset_kwargs == SMALL_WORLD
    with pytest.raises(TypeError, match="did you mean 'dataset_kwargs'"):
        SearchEnv(dataset_kwarg=SMALL_WORLD)
    with pytest.raises(ValueError, match="expected corpus_mode 'pool', 'corpus' or None"):
        DataConfig(corpus_mode="full")
    with pytest.raises(TypeError, match="expected data to be a DataConfig"):
        SearchEnv({"dataset": "synthhop"})
    with pytest.raises(ValueError, match="expected no index argument for a ReaderEnv"):
        ReaderEnv(data, index="some/dir")


@pytest.mark.parametrize("stem", OPEN)
def test_open_domain_ids_read_flashrag_and_name_the_corpus_they_need(stem, tmp_path_factory):
    kwargs = flashrag_fixture(tmp_path_factory)
    env = gym.make(f"rag_gym/{stem}-v0", **kwargs)
    assert env.unwrapped.corpus_mode == "corpus" and env.unwrapped.split == "test"
    _, info = env.reset(seed=0)
    rows = [json.loads(line) for line in Path(kwargs["data_path"]).read_text().splitlines()]
    row = next(r for r in rows if r["id"] == info["question_id"])
    assert info["question"] == row["question"]
    assert list(env.unwrapped.current_example.answers) == row["golden_answers"]
    env.close()
    with pytest.raises(ValueError, match="give a corpus to search") as caught:
        gym.make(f"rag_gym/{stem}-v0", data_path=kwargs["data_path"])
    for way in ("corpus=", "index=", "retriever="):
        assert way in str(caught.value)

"""Registries open to code outside rag-gym: names registered in code or by an installed
package's entry points (``tests/fixtures/plugins``, a package with its dist-info, put on the path
as ``pip install`` would), looked up alike, in this process and in a fresh one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from rag_gym._registry import NO_PLUGINS_ENV, Registry, RegistryError
from tests.conftest import fresh_registry as _fresh

PLUGINS = Path(__file__).resolve().parent / "fixtures" / "plugins"
ROOT = Path(__file__).resolve().parents[1]


def test_code_registers_and_looks_up_by_name():
    reg = Registry("widget", "rag_gym.test_widgets", lambda name, v: int(v))
    assert reg.register("one", "1") == 1 and reg.get("one") == 1
    with pytest.raises(RegistryError, match=r"a widget named 'one' is already registered \(code\)"):
        reg.register("one", 2)
    assert reg.register("one", 2, replace=True) == 2 and reg.get("one") == 2
    with pytest.raises(
        ValueError, match=r"expected a widget in \['one'\], got 'onr'; did you mean"
    ):
        reg.get("onr")
    for bad in ("", " one", "a:b", 3):
        with pytest.raises(RegistryError, match="expected a widget name"):
            reg.register(bad, 1)
    with pytest.raises(ValueError, match="invalid literal"):
        reg.register("two", "not a number")  # the kind's own check
    assert "two" not in reg and reg.names() == ["one"]


class _Point:
    """An entry point as importlib.metadata gives one, loading ``load()``."""

    def __init__(self, name, load, value="pkg.mod:obj"):
        self.name, self.value, self.dist, self._load = name, value, None, load

    def load(self):
        return self._load()


def test_aliases_replace_and_spellings_stay_consistent():
    reg = Registry("dataset", "rag_gym.test_datasets", normalise=lambda n: n.lower())
    reg.register("HotpotQA", 1, aliases=("hotpot",))
    reg.register("musique", 2)
    with pytest.raises(RegistryError, match="'musique' already names the dataset 'musique'"):
        reg.register("other", 3, aliases=("musique",), replace=True)
    with pytest.raises(RegistryError, match="'hotpot' already names the dataset 'HotpotQA'"):
        reg.register("musique", 3, aliases=("hotpot",), replace=True)
    reg.register("hotpotqa", 4, replace=True)  # another spelling: it takes over, aliases kept
    assert [reg.get(n) for n in ("HOTPOTQA", "hotpot", "musique")] == [4, 4, 2]
    assert reg.names() == ["musique", "hotpotqa"] and reg.key("hotpot") == "hotpotqa"
    assert reg["Hotpot"] == 4
    with pytest.raises(KeyError, match="did you mean"):
        reg["hotpt"]


def test_a_package_that_registers_itself_on_import_and_a_late_code_registration(monkeypatch):
    import rag_gym._registry as registry_module

    reg = Registry("widget", "rag_gym.test_widgets")
    points = [
        _Point("self_made", lambda: reg.register("self_made", "made on import") and "entry"),
        _Point("plain", lambda: "from the entry point"),
    ]
    monkeypatch.delenv(NO_PLUGINS_ENV, raising=False)
    monkeypatch.setattr(registry_module, "_entry_points", lambda group: points)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert reg.get("self_made") == "made on import" and reg.get("self_made") == "made on import"
    with pytest.warns(UserWarning, match="entry point 'late' .* skipped: .* registered in code"):
        points.append(_Point("late", lambda: "never"))
        late = Registry("widget", "rag_gym.test_widgets")
        late.names()
        late.register("late", "in code")
    assert late.get("late") == "in code" and reg.get("plain") == "from the entry point"


@pytest.fixture
def plugins(monkeypatch, isolated_registries):
    """The fixture package on the path, entry points read (every registry restored after)."""
    monkeypatch.syspath_prepend(str(PLUGINS))
    monkeypatch.delenv(NO_PLUGINS_ENV, raising=False)
    import importlib

    importlib.invalidate_caches()
    yield
    sys.modules.pop("rag_gym_example_plugin", None)


def test_an_installed_package_s_entry_point_is_named_before_import_and_loaded_on_lookup(plugins):
    from rag_gym.generation.backends import _as_backend

    reg = Registry("backend", "rag_gym.lm_backends", _as_backend)
    reg.register("llama_cpp", lambda arg, **options: None)
    sys.modules.pop("rag_gym_example_plugin", None)
    assert reg.names() == ["llama_cpp", "constant"]
    assert "rag_gym_example_plugin" not in sys.modules  # listed, not imported
    assert reg.origin("constant") == "package rag-gym-example-plugin"
    backend = reg.get("constant")
    assert backend.spec == "constant[:REPLY]" and "rag_gym_example_plugin" in sys.modules


def test_make_lm_builds_a_backend_from_an_entry_point(plugins, monkeypatch):
    from rag_gym.generation import backends

    _fresh(monkeypatch, backends.BACKENDS)
    lm = backends.make_lm("constant:Rome", max_new_tokens=8)
    assert lm.describe() == {"backend": "constant", "reply": "Rome"}
    assert lm.generate(["q?"])[0][0].text == "Rome" and lm.max_new_tokens == 8
    with pytest.raises(ValueError, match="has no context window"):
        backends.make_lm("constant", n_ctx=512)
    with pytest.raises(ValueError, match=r"did you mean 'constant'"):
        backends.make_lm("constnt")


def test_a_broken_or_clashing_entry_point_is_named_never_silent(plugins, tmp_path, monkeypatch):
    dist = tmp_path / "broken_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[rag_gym.lm_backends]\nbroken = no_such_module_anywhere:backend\n"
        "llama_cpp = no_such_module_anywhere:backend\nnot_one = json:dumps_not_there\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    from rag_gym.generation.backends import _as_backend

    reg = Registry("backend", "rag_gym.lm_backends", _as_backend)
    reg.register("llama_cpp", lambda arg, **options: None)
    with pytest.warns(
        UserWarning, match=r"package broken-plugin's entry point 'llama_cpp'.*skipped"
    ):
        names = reg.names()
    assert "broken" in names and names.count("llama_cpp") == 1
    with pytest.raises(
        RegistryError, match=r"'broken' \(package broken-plugin: .*failed to import"
    ):
        reg.get("broken")
    with pytest.raises(RegistryError, match="failed to import"):
        reg.get("not_one")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert reg.get("constant").spec == "constant[:REPLY]"  # the others still load


def test_no_plugins_leaves_entry_points_unread(plugins, monkeypatch):
    monkeypatch.setenv(NO_PLUGINS_ENV, "1")
    reg = Registry("backend", "rag_gym.lm_backends")
    assert reg.names() == [] and "constant" not in reg


@pytest.mark.slow
def test_rag_gym_evaluate_takes_an_installed_package_s_dataset_preset_agent_and_backend(tmp_path):
    """A fresh ``rag-gym evaluate`` process with the package installed (on its path) and no
    registration code run: its dataset by ``dataset=``, its reward preset by ``reward_preset=``,
    its agent by ``--agents`` and its backend by ``--lm``, each recorded in the protocol."""
    env = {k: v for k, v in os.environ.items() if k != NO_PLUGINS_ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(PLUGINS), str(ROOT)])
    result = subprocess.run(
        [
            *(sys.executable, "-m", "rag_gym.cli", "evaluate", "--env", "rag_gym/HotpotQA-v0"),
            "--env-kwargs",
            '{"dataset": "capitals", "reward_preset": "capital_bonus"}',
            *("--split", "test", "--n", "4"),
            *("--lm", "constant:Paris", "--agents", "lookup,naive_rag"),
            *("--out", str(tmp_path), "--run-name", "p", "--no-progress"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    protocol = json.loads((tmp_path / "p" / "protocol.json").read_text())
    assert protocol["lm_spec"] == "constant:Paris"
    assert protocol["agents"]["naive_rag"]["lm"] == {"backend": "constant", "reply": "Paris"}
    assert protocol["agents"]["lookup"]["name"] == "lookup"
    rows = [
        json.loads(line) for line in (tmp_path / "p" / "episodes.jsonl").read_text().splitlines()
    ]
    by_agent = {a: [r for r in rows if r["agent"] == a] for a in ("lookup", "naive_rag")}
    assert [r["prediction"] for r in by_agent["naive_rag"]] == ["Paris"] * 4
    assert sorted(r["prediction"] for r in by_agent["lookup"]) == [
        "Lima",
        "Madrid",
        "Paris",
        "Rome",
    ]
    assert all(r["em"] == 1.0 for r in by_agent["lookup"])
    # the package's reward preset scored them: exact match plus 0.5 for the gold passage found
    assert protocol["env_kwargs"]["reward_preset"] == "capital_bonus"
    assert [r["reward"] for r in by_agent["lookup"]] == [1.5] * 4


def test_an_entry_point_dataset_plays_through_rag_gym_make(plugins, monkeypatch):
    """The package's ``capitals`` loader, by name in ``rag_gym.make``: its questions and its
    passage pool searched; ``load`` reads it, case and dashes ignored as for rag-gym's own."""
    import rag_gym
    from rag_gym import data

    _fresh(monkeypatch, data.DATASETS)
    assert [ex.answers for ex in data.load("Capitals", "test")][:2] == [("Paris",), ("Rome",)]
    env = rag_gym.make("rag_gym/HotpotQA-v0", dataset="capitals", split="test")
    _, info = env.reset(options={"question_index": 1})
    assert info["question"] == "What is the capital of Italy?"
    from rag_gym.envs.search import ActionType

    obs, *_ = env.step({"type": ActionType.SEARCH, "text": "capital of Italy"})
    assert "The capital of Italy is Rome." in str(obs)
    _, reward, terminated, _, info = env.step({"type": ActionType.ANSWER, "text": "Rome"})
    assert terminated and reward == 1.0
    with pytest.raises(ValueError, match=r"did you mean 'capitals'"):
        data.load("capitels", "test")


def test_register_dataset_takes_a_loader_a_variant_and_refuses_a_clash(monkeypatch):
    from rag_gym import data

    _fresh(monkeypatch, data.DATASETS)
    with pytest.raises(
        RegistryError, match=r"a dataset named 'HotpotQA' is already registered \(rag-gym\)"
    ):
        data.register_dataset("HotpotQA", lambda path, split, **o: [])
    with pytest.raises(ValueError, match=r"did you mean 'synthhop'"):
        data.register_dataset("mine", "synthop")
    data.register_dataset("Tiny-Hop", "synthhop-hard", defaults={"n_passages": 2000})
    assert data.canonical_name("tinyhop") == "synthhop"
    assert data.dataset_defaults("TINY-HOP") == {"preset": "hard", "n_passages": 2000}
    assert data.DATASETS.origin("tiny-hop") == "module tests.test_registry"


def test_register_agent_takes_a_class_and_make_agent_builds_it(monkeypatch):
    from rag_gym import baselines
    from rag_gym.baselines.random import RandomAgent

    _fresh(monkeypatch, baselines.AGENTS)

    class Coin(RandomAgent):
        name = "coin"

    baselines.register_agent("coin", Coin)
    assert type(baselines.make_agent("coin", seed=3)) is Coin and not baselines.needs_lm("coin")
    with pytest.raises(ValueError, match=r"expected a checkpoint only after search_r1"):
        baselines.make_agent("coin:x")
    with pytest.raises(RegistryError, match="already registered"):
        baselines.register_agent("random", Coin)
    with pytest.raises(TypeError, match="expected an Agent subclass"):
        baselines.register_agent("not_one", object)


def test_an_entry_point_preset_with_its_term_tags_and_agent_plays_through_rag_gym_make(
    plugins, monkeypatch
):
    """The package's ``capital_bonus`` preset: its two reward terms around the env (and again
    from ``env.spec``), its option, its own tag set for a text policy, its agent by name."""
    import gymnasium as gym

    import rag_gym
    from rag_gym import data
    from rag_gym.baselines import AGENTS, make_agent
    from rag_gym.envs.tags import TAG_PRESETS
    from rag_gym.train.episodes import default_tags, env_factory, played_tags
    from rag_gym.wrappers.presets import PRESETS, set_stage

    for registry in (data.DATASETS, PRESETS, TAG_PRESETS, AGENTS):
        _fresh(monkeypatch, registry)
    env = rag_gym.make(
        "rag_gym/HotpotQA-v0",
        dataset="capitals",
        split="test",
        reward_preset="capital_bonus",
        reward_kwargs={"bonus": 0.25},
    )
    assert [w.name for w in env.spec.additional_wrappers] == [
        "DropBaseReward",
        "GoldHit",
        "AnswerEM",
    ]
    agent = make_agent(PRESETS.get("capital_bonus").agent)
    for built in (env, gym.make(env.spec)):
        obs, info = built.reset(options={"question_index": 2})
        agent.reset(0)
        total, terminated = 0.0, False
        while not terminated:
            obs, reward, terminated, _, info = built.step(agent.act(obs, info))
            total += reward
        assert info["prediction"] == "Madrid" and total == 1.25
        assert info["reward_terms"] == {"gold_hit": 0.0, "answer_em": 1.0}
    assert default_tags("capital_bonus") == "plan_tags"
    text_env = env_factory(
        "rag_gym/HotpotQA-v0", split="test", reward_preset="capital_bonus", dataset="capitals"
    )()
    assert played_tags(text_env) == "plan_tags"
    from rag_gym.wrappers.text_actions import text_actions_of

    assert "<plan>" in text_actions_of(text_env).system_prompt
    with pytest.raises(TypeError, match=r"unknown options \['beta'\]; it takes \['bonus'\]"):
        rag_gym.make(
            "rag_gym/HotpotQA-v0",
            dataset="capitals",
            reward_preset="capital_bonus",
            reward_kwargs={"beta": 1},
        )
    with pytest.raises(ValueError, match="no staged reward"):
        set_stage(env, 2)


def test_an_entry_point_retriever_kind_loads_its_index_through_rag_gym_make(
    plugins, monkeypatch, tmp_path
):
    """The package's ``keyword`` retriever saves an index folder of its own kind; ``index=`` that
    folder in ``rag_gym.make`` loads it through the kind's entry point and the env searches with
    it. An unknown kind is named."""
    import json as _json

    import rag_gym
    from rag_gym import data
    from rag_gym.data import Corpus
    from rag_gym.envs.search import ActionType
    from rag_gym.retrieval.kinds import RETRIEVER_KINDS
    from rag_gym.retrieval.load import load_index

    for registry in (data.DATASETS, RETRIEVER_KINDS):
        _fresh(monkeypatch, registry)
    passages = {p.id: p for ex in data.load("capitals", "test") for p in ex.passages}
    from rag_gym_example_plugin import KeywordRetriever

    KeywordRetriever(Corpus(list(passages.values()), name="capitals")).save(tmp_path / "kw")
    retriever, kind = load_index(tmp_path / "kw")
    assert kind == "keyword" and type(retriever).__name__ == "KeywordRetriever"
    env = rag_gym.make(
        "rag_gym/HotpotQA-v0", dataset="capitals", split="test", index=str(tmp_path / "kw"), k=1
    )
    assert type(env.unwrapped.retriever).__name__ == "KeywordRetriever"
    env.reset(options={"question_index": 3})
    _, _, _, _, info = env.step({"type": ActionType.SEARCH, "text": "capital of Peru"})
    assert info["retrieved_ids"] == ["cap-Peru"]
    params = _json.loads((tmp_path / "kw" / "params.json").read_text())
    params["kind"] = "keywords"
    (tmp_path / "kw" / "params.json").write_text(_json.dumps(params))
    with pytest.raises(
        ValueError, match=r"expected kind 'bm25', 'dense' or 'keyword', got 'keywords'"
    ):
        load_index(tmp_path / "kw")

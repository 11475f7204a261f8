"""What a checkpoint was trained on, and the evaluated questions it has seen (agents.provenance)."""

from __future__ import annotations

import json
import warnings

import gymnasium as gym
import pytest

import rag_gym  # noqa: F401  (registers the envs)
from rag_gym.agents.provenance import (
    SeenQuestionsWarning,
    normal_question,
    seen_questions,
    training_sets,
)
from rag_gym.agents.search_r1 import checkpoint_path
from tests.conftest import SMALL_WORLD, EchoLM

HARD = "rag_gym/SynthHop-Hard-v0"


def questions(env_id: str, split: str, **dataset_kwargs) -> list[str]:
    env = gym.make(env_id, split=split, dataset_kwargs={**SMALL_WORLD, **dataset_kwargs})
    try:
        return [ex.question for ex in env.unwrapped.examples]
    finally:
        env.close()


def run_folder(path, env_kwargs, split="train", init=None, **extra):
    (path / "final").mkdir(parents=True)
    config = {"env_id": HARD, "env_kwargs": env_kwargs, "split": split, **extra}
    (path / "config.json").write_text(json.dumps(config))
    if init is not None:  # a GRPO run records the run it started from
        (path / "init.json").write_text(json.dumps({"init": str(init), "eval_n": 0}))
    return path


def test_the_shipped_checkpoint_has_seen_its_train_split_and_nothing_of_validation():
    ship = checkpoint_path("synthhop")
    [ts] = training_sets(ship)
    assert (ts.env_id, ts.env_kwargs, ts.split) == ("rag_gym/SynthHop-v0", {}, "train")
    for split, expected in (("validation", 0), ("test", 0), ("train", 30)):
        env = gym.make("rag_gym/SynthHop-v0", split=split)
        asked = [ex.question for ex in env.unwrapped.examples[:30]]
        report = seen_questions(ship, asked)
        assert (report["seen"], report["n"]) == (expected, 30), split


def test_worlds_that_differ_in_unanswerable_rate_share_questions_across_splits(tmp_path):
    # the contamination this module exists for: an SFT run on a 30%-unanswerable world,
    # evaluated on the default Hard world's test split
    sft = run_folder(
        tmp_path / "sft", {"dataset_kwargs": {**SMALL_WORLD, "unanswerable_rate": 0.3}}
    )
    asked = questions(HARD, "test")
    trained = {normal_question(q) for q in questions(HARD, "train", unanswerable_rate=0.3)}
    expected = sum(normal_question(q) in trained for q in asked)
    assert expected > 0  # the two worlds do deal some of one's test questions to the other's train
    for where in (sft, sft / "final"):  # the run folder, or the adapter folder inside it
        report = seen_questions(where, asked)
        assert (report["seen"], report["n"]) == (expected, len(asked))
    # the training world's own test split shares nothing with its train split
    own = questions(HARD, "test", unanswerable_rate=0.3)
    assert seen_questions(sft, own)["seen"] == 0
    # a GRPO run from that SFT run has seen what its start has, and its own split too
    grpo = run_folder(tmp_path / "grpo", {"dataset_kwargs": SMALL_WORLD}, split="test", init=sft)
    sets = training_sets(grpo / "final")
    assert [(ts.split, ts.source.endswith("grpo/config.json")) for ts in sets] == [
        ("test", True),
        ("train", False),
    ]
    report = seen_questions(grpo, asked)
    assert report["seen"] == len(asked)  # it trained on this very split
    assert [row["seen"] for row in report["training_sets"]] == [len(asked), expected]


def test_a_checkpoint_that_does_not_say_is_not_checked(tmp_path):
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert training_sets(bare) == []
    assert seen_questions(bare, ["Who?"]) == {"seen": None, "n": 1, "training_sets": []}


def test_a_training_split_that_no_longer_builds_is_a_warning_not_a_crash(tmp_path):
    gone = run_folder(tmp_path / "gone", {"dataset_kwargs": {"no_such_option": 1}})
    with pytest.warns(SeenQuestionsWarning, match="did not build"):
        report = seen_questions(gone, ["Who?"])
    assert report["seen"] is None and "error" in report["training_sets"][0]


def test_evaluate_records_and_warns_about_questions_the_agent_trained_on(tmp_path):
    from rag_gym.baselines import make_agent
    from rag_gym.evaluate import EvalConfig, evaluate

    class AdapterLM(EchoLM):
        def with_adapter(self, path):
            return self

    world = {"dataset_kwargs": SMALL_WORLD}
    leaked = run_folder(tmp_path / "leaked", world, split="validation", tags="evo_rag")
    clean = run_folder(tmp_path / "clean", world, split="train", tags="evo_rag")
    agents = (f"search_r1:{leaked}", f"search_r1:{clean}", "random")
    cfg = EvalConfig(
        env_id=HARD,
        env_kwargs=world,
        split="validation",
        n=4,
        agents=agents,
        out_dir=str(tmp_path / "runs"),
        run_name="run",
    )
    factory = lambda name, env: make_agent(name, lm=AdapterLM(), seed=1)  # noqa: E731
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        evaluate(cfg, factory)
    said = [str(w.message) for w in caught if issubclass(w.category, SeenQuestionsWarning)]
    assert len(said) == 1 and said[0].startswith(f"search_r1:{leaked}: 4 of the 4 evaluated")
    assert "not held out" in said[0]
    protocol = json.loads((tmp_path / "runs" / "run" / "protocol.json").read_text())
    assert protocol["agents"][agents[0]]["seen_questions"]["seen"] == 4
    assert protocol["agents"][agents[1]]["seen_questions"]["seen"] == 0
    assert "seen_questions" not in protocol["agents"]["random"]
    # a resume compares the agents' settings, not this report (which it makes again)
    with pytest.warns(SeenQuestionsWarning, match="4 of the 4"):
        evaluate(cfg, factory, resume=True)


def test_every_path_to_a_checkpoint_finds_its_run(tmp_path):
    world = {"dataset_kwargs": {**SMALL_WORLD, "unanswerable_rate": 0.3}}
    run = run_folder(tmp_path / "run", world)
    (run / "final" / "adapter.gguf").write_bytes(b"GGUF")
    (run / "checkpoint-50").mkdir()
    # an EVO-RAG DPO cycle's adapter sits two folders below its run's config.json
    (run / "refinement" / "cycle2").mkdir(parents=True)
    expected = [(HARD, world, "train")]
    for where in ("final", "final/adapter.gguf", "checkpoint-50", "refinement/cycle2", "."):
        sets = training_sets(run / where)
        assert [(ts.env_id, ts.env_kwargs, ts.split) for ts in sets] == expected, where
    # env_kwargs kept as a command line's JSON string
    text = tmp_path / "text"
    (text / "final").mkdir(parents=True)
    config = {"env_id": HARD, "env_kwargs": json.dumps(world)}
    (text / "config.json").write_text(json.dumps(config))
    [ts] = training_sets(text / "final")
    assert ts.env_kwargs == world and ts.split == "train"


def test_a_start_that_is_gone_is_said(tmp_path):
    grpo = run_folder(
        tmp_path / "grpo", {"dataset_kwargs": SMALL_WORLD}, init=tmp_path / "elsewhere" / "sft"
    )
    with pytest.warns(SeenQuestionsWarning, match="not there"):
        sets = training_sets(grpo)
    assert [ts.split for ts in sets] == ["train"]  # the run's own split is still checked


@pytest.mark.slow
def test_a_packaged_checkpoint_keeps_the_splits_of_the_runs_it_came_from(tmp_path):
    pytest.importorskip("safetensors")
    pytest.importorskip("gguf")
    import shutil

    from rag_gym.train.ship import package_adapter

    world = {"dataset_kwargs": {**SMALL_WORLD, "unanswerable_rate": 0.3}}
    sft = run_folder(tmp_path / "sft", world)
    grpo = run_folder(tmp_path / "grpo", {"dataset_kwargs": SMALL_WORLD}, "validation", init=sft)
    ship = checkpoint_path("synthhop")
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        shutil.copy(ship / name, grpo / "final" / name)
    # the card names only the env, as the pipeline's does: the runs' own records say the rest
    card = {"env_id": HARD, "tags": "evo_rag"}
    out = package_adapter(grpo / "final", tmp_path / "packaged", card)
    meta = json.loads((out / "rag_gym.json").read_text())
    assert [(t["env_kwargs"], t["split"]) for t in meta["training_sets"]] == [
        ({"dataset_kwargs": SMALL_WORLD}, "validation"),
        (world, "train"),
    ]
    shutil.rmtree(tmp_path / "sft")  # a packaged checkpoint travels without its runs
    shutil.rmtree(tmp_path / "grpo")
    asked = questions(HARD, "test")
    trained = {normal_question(q) for q in questions(HARD, "train", unanswerable_rate=0.3)}
    report = seen_questions(out, asked)
    assert report["seen"] == sum(normal_question(q) in trained for q in asked) > 0
    assert seen_questions(out, questions(HARD, "validation"))["seen"] == 30


def test_reader_splits_count_only_the_questions_the_reader_poses(tmp_path):
    from rag_gym.agents.provenance import TrainingSet, split_questions

    world = {"dataset_kwargs": {**SMALL_WORLD, "unanswerable_rate": 0.3}}
    search = split_questions(TrainingSet(HARD, world, "train"))
    reader = split_questions(TrainingSet("rag_gym/SynthHop-Hard-Reader-v0", world, "train"))
    env = gym.make("rag_gym/SynthHop-Hard-Reader-v0", split="train", **world)
    assert reader == {normal_question(ex.question) for ex in env.unwrapped.examples}
    assert reader < search  # the reader skips the unanswerable questions


def test_a_packaged_card_without_its_runs_falls_back_to_its_own_record(tmp_path):
    card = tmp_path / "card"
    card.mkdir()
    meta = {"env_id": HARD, "env_kwargs": {"dataset_kwargs": SMALL_WORLD}, "training_sets": []}
    (card / "rag_gym.json").write_text(json.dumps(meta))
    [ts] = training_sets(card)
    assert (ts.env_id, ts.env_kwargs, ts.split) == (HARD, meta["env_kwargs"], "train")


def test_a_run_that_mixed_splits_counts_each_and_a_split_by_id_holds_nothing_back(tmp_path):
    """An SFT run over several envs lists them in config.json's training_sets; a real-data file
    split by id has seen its train share, and none of its test share."""
    from rag_gym.data.splits import id_split
    from tests.agents.test_real_expert import HOTPOT

    records = [
        {**HOTPOT[0], "_id": f"h{i}", "question": f"Where was the author of novel {i} born?"}
        for i in range(30)
    ]
    data = tmp_path / "h.json"
    data.write_text(json.dumps(records))
    real = {"data_path": str(data), "dataset_kwargs": {"split_by_id": True}}
    run = tmp_path / "run"
    run_folder(
        run,
        {},
        env_id="rag_gym/HotpotQA-v0,rag_gym/SynthHop-v0",
        training_sets=[
            {"env_id": "rag_gym/HotpotQA-v0", "env_kwargs": real, "split": "train"},
            {"env_id": "rag_gym/SynthHop-v0", "env_kwargs": {"dataset_kwargs": SMALL_WORLD}},
        ],
    )
    assert [ts.env_id for ts in training_sets(run / "final")] == [
        "rag_gym/HotpotQA-v0",
        "rag_gym/SynthHop-v0",
    ]
    by_split = {
        s: [r["question"] for r in records if id_split(r["_id"]) == s] for s in ("train", "test")
    }
    assert by_split["train"] and by_split["test"]
    report = seen_questions(run / "final", by_split["test"])
    assert report["seen"] == 0 and report["n"] == len(by_split["test"])
    report = seen_questions(
        run / "final", by_split["train"] + questions("rag_gym/SynthHop-v0", "train")[:3]
    )
    assert report["seen"] == len(by_split["train"]) + 3
    assert [row["seen"] for row in report["training_sets"]] == [len(by_split["train"]), 3]


def test_the_base_and_template_a_checkpoint_was_trained_with(tmp_path):
    """A run's config.json names its base (``model``) and template; a GRPO run names its SFT
    run's base through init.json; a packaged checkpoint's rag_gym.json says ``base``; an adapter
    from elsewhere says nothing."""
    from rag_gym.agents.provenance import (
        recorded_base,
        recorded_chat_template,
        recorded_template,
    )

    sft = tmp_path / "sft"
    (sft / "final").mkdir(parents=True)
    template = {"from": "builtin", "name": "gemma", "sha256": "x"}
    (sft / "config.json").write_text(
        json.dumps(
            {"env_id": "rag_gym/SynthHop-v0", "model": "/m/g.gguf", "chat_template": template}
        )
    )
    assert recorded_base(sft / "final") == "/m/g.gguf"
    assert recorded_template(sft / "final") == template
    assert recorded_chat_template(sft / "final") == "gemma"
    grpo = tmp_path / "grpo"
    (grpo / "final").mkdir(parents=True)
    (grpo / "init.json").write_text(json.dumps({"init": str(sft / "final")}))
    assert recorded_base(grpo / "final") == "/m/g.gguf"
    packaged = tmp_path / "ckpt"
    packaged.mkdir()
    record = {"base": "embedded", "chat_template": {"from": "file", "file": "/t.jinja"}}
    (packaged / "rag_gym.json").write_text(json.dumps(record))
    assert recorded_base(packaged) == "embedded"
    assert recorded_chat_template(packaged) == "/t.jinja"
    own = tmp_path / "own"
    own.mkdir()
    (own / "rag_gym.json").write_text(json.dumps({"base": "embedded"}))
    assert recorded_chat_template(own) is None  # the model's own
    elsewhere = tmp_path / "elsewhere" / "a" / "b" / "c" / "d"
    elsewhere.mkdir(parents=True)
    assert recorded_base(elsewhere) is None and recorded_template(elsewhere) is None

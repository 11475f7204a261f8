"""Training rollouts in the step-trace schema: the engine's per-turn trace and RolloutLog."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from rag_gym import traces
from rag_gym.train.rollout_log import RolloutLog


def episode(i: int, ret: float = 0.0):
    step = traces.step_record(
        1, "<answer>x</answer>", {"action_type": "ANSWER", "prediction": "x"}, ret, ["g"]
    )
    trace = {
        "question_id": f"q{i}",
        "question": f"question {i}?",
        "answers": ["x"],
        "gold_ids": ["g"],
        "steps": [step],
        "passages": {"g": {"title": "G", "text": "gold text"}},
    }
    return SimpleNamespace(episode_return=ret, em=ret, trace=trace)


def read(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_rollout_log_saves_a_sample_every_n_steps(tmp_path):
    log = RolloutLog(tmp_path, every=2, n=3, seed=0)
    eps = [episode(i, float(i % 2)) for i in range(8)]
    assert [log(step, eps) for step in (1, 2, 3, 4)] == [0, 3, 0, 3]
    assert log(4, eps) == 0  # a step is saved once
    assert log(5, eps, force=True) == 3
    records = read(tmp_path / "steps.jsonl")
    assert [r["train_step"] for r in records] == [2] * 3 + [4] * 3 + [5] * 3
    assert all(r["schema_version"] == traces.SCHEMA_VERSION for r in records)
    assert len({r["question_id"] for r in records[:3]}) == 3  # 3 distinct episodes drawn
    for r in records:
        i = int(r["question_id"][1:])
        assert r["reward"] == float(i % 2) and r["question"] == f"question {i}?"
        assert r["steps"][0]["raw_output"] == "<answer>x</answer>"
    assert read(tmp_path / "passages.jsonl") == [{"id": "g", "title": "G", "text": "gold text"}]
    assert RolloutLog(tmp_path / "never", every=0)(10, eps) == 0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"every": -1}, "expected every to be an int >= 0"), ({"n": 0}, "expected n to be an int")],
)
def test_rollout_log_rejects_bad_arguments(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        RolloutLog(tmp_path, **kwargs)


def test_engine_episodes_carry_their_step_trace(tmp_path):
    transformers = pytest.importorskip("transformers")
    from rag_gym.train.models import trainable_embedded
    from tests.train.test_train import Scripted, _answers, _engine

    tokenizer = transformers.AutoTokenizer.from_pretrained(trainable_embedded())
    engine = _engine(tokenizer)
    episodes = engine.play(Scripted(tokenizer, _answers(engine)), [0, 1])
    for ep in episodes:
        tr = ep.trace
        ex = engine.envs[0].unwrapped.examples[ep.index]
        assert tr["question"] == ex.question and tr["answers"] == list(ex.answers)
        assert [s["action"] for s in tr["steps"]] == ["SEARCH", "ANSWER"]
        search, answer = tr["steps"]
        assert search["raw_output"].startswith("<think>look it up</think><search>")
        assert search["completion_tokens"] > 0 and len(search["retrieved"]) == 3
        assert all(r["gold"] == (r["id"] in tr["gold_ids"]) for r in search["retrieved"])
        assert answer["text"] == ex.answers[0]
        assert sum(s["reward"] for s in tr["steps"]) == pytest.approx(ep.episode_return)
        ids = {r["id"] for r in search["retrieved"]} | set(tr["gold_ids"])
        assert ids <= set(tr["passages"])
    log = RolloutLog(tmp_path, every=1, n=2)
    assert log(1, episodes) == 2
    assert {r["question_id"] for r in read(tmp_path / "steps.jsonl")} == {
        ep.trace["question_id"] for ep in episodes
    }


@pytest.mark.slow
def test_with_a_wandb_run_the_sample_is_logged_as_a_table(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb", reason="the wandb.Table needs the track extra")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = wandb.init(project="rag-gym-test", dir=str(tmp_path), mode="offline")
    try:
        log = RolloutLog(tmp_path / "run", every=1, n=2, seed=0)
        assert log(1, [episode(i, 1.0) for i in range(4)]) == 2
        wandb.log({"loss": 0.5})  # commits the step the table was logged in
    finally:
        run.finish()
    tables = list(tmp_path.rglob("rollouts/samples_*.table.json"))
    assert len(tables) == 1, sorted(p.name for p in tmp_path.rglob("*"))
    table = json.loads(tables[0].read_text())
    assert table["columns"] == [
        "train_step",
        "question",
        "answers",
        "return",
        "em",
        "steps",
        "trace",
    ]
    assert len(table["data"]) == 2 and {row[0] for row in table["data"]} == {1}
    assert all(json.loads(row[6])[0]["raw_output"] == "<answer>x</answer>" for row in table["data"])

"""Step traces written by evaluation: schema, contents, passages stored once, resume."""

from __future__ import annotations

import json
import re

import pytest

from rag_gym import traces
from rag_gym.baselines import make_agent
from rag_gym.evaluate import RunInterrupted, evaluate
from tests.conftest import SMALL_WORLD, EchoLM
from tests.test_evaluate import StopAfter, config, oracle_reply


def read(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def answers():
    from rag_gym.data.synthhop import world_for

    world = world_for("default", **SMALL_WORLD)
    return {q.question: q.answer for q in world.questions["validation"]}


def test_each_episode_has_its_steps_and_each_passage_is_stored_once(tmp_path, answers):
    lm = EchoLM(reply=oracle_reply(answers))
    result = evaluate(
        config(tmp_path, n=6, agents=("naive_rag", "random")),
        lambda name, env: make_agent(name, lm=lm, seed=1),
    )
    run = tmp_path / "run"
    steps = read(run / "steps.jsonl")
    episodes = read(run / "episodes.jsonl")
    # one trace per episode, in the episodes' order
    assert [(s["agent"], s["question_id"]) for s in steps] == [
        (e["agent"], e["question_id"]) for e in episodes
    ]
    assert all(s["schema_version"] == traces.SCHEMA_VERSION for s in steps)
    for s, e in zip(steps, episodes, strict=True):
        assert len(s["steps"]) == e["steps"]
        assert [st["action"] for st in s["steps"]] == e["actions"]
        assert sum(st["reward"] for st in s["steps"]) == pytest.approx(e["reward"])
        assert sum(st["prompt_tokens"] for st in s["steps"]) == e["prompt_tokens"]
        assert sum(st["completion_tokens"] for st in s["steps"]) == e["completion_tokens"]
        retrieved = [r["id"] for st in s["steps"] for r in st["retrieved"]]
        assert retrieved == e["retrieved_ids"]  # exclude_seen: each id comes back once
        for st in s["steps"]:
            assert set(st["reward_terms"]) == {"answer", "invalid"}
            assert [r["rank"] for r in st["retrieved"]] == list(range(1, len(st["retrieved"]) + 1))
            assert all(r["gold"] == (r["id"] in e["gold_ids"]) for r in st["retrieved"])
    naive = [s for s in steps if s["agent"] == "naive_rag"]
    search, answer = naive[0]["steps"]
    assert search["action"] == "SEARCH" and search["raw_output"] is None  # no model call
    question = next(e["question"] for e in episodes if e["question_id"] == naive[0]["question_id"])
    assert search["text"] == question and len(search["retrieved"]) == 3
    scores = [r["score"] for r in search["retrieved"]]
    assert scores == sorted(scores, reverse=True) and scores[0] > 0  # BM25 scores, ranked
    # the reader's reply, raw, and the tokens its call spent
    assert answer["action"] == "ANSWER" and answer["raw_output"].startswith("Answer: ")
    assert (answer["prompt_tokens"], answer["completion_tokens"]) == (10, 2)
    assert answer["reward_terms"]["answer"] == 1.0
    # passages: every retrieved and gold id, once
    passages = read(run / "passages.jsonl")
    ids = [p["id"] for p in passages]
    assert len(ids) == len(set(ids))
    needed = {i for e in result.episodes for i in e["retrieved_ids"] + e["gold_ids"]}
    assert needed <= set(ids)
    assert all(p["title"] and p["text"] for p in passages)


def test_resumed_run_has_one_trace_per_episode(tmp_path):
    full = evaluate(config(tmp_path, run_name="full", agents=("random",)), StopAfter(10**9))
    with pytest.raises(RunInterrupted):
        evaluate(config(tmp_path, agents=("random",), batch_size=2), StopAfter(4))
    run = tmp_path / "run"
    with open(run / "steps.jsonl", "a") as f:
        f.write('{"schema_version": 1, "agent": "ran')  # a kill -9 mid-write
    evaluate(config(tmp_path, agents=("random",)), StopAfter(10**9), resume=True)
    steps = read(run / "steps.jsonl")
    assert [s["question_id"] for s in steps] == [e["question_id"] for e in full.episodes]
    assert [s["steps"] for s in steps] == [
        s["steps"] for s in read(tmp_path / "full" / "steps.jsonl")
    ]
    ids = [p["id"] for p in read(run / "passages.jsonl")]
    assert len(ids) == len(set(ids))


def test_read_jsonl_names_a_cut_last_line(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text('{"a": 1}\nnot json\n{"b": 2}\n{"c": ')
    records, problems = traces.read_jsonl(path)
    assert [r for r, _ in records] == [{"a": 1}, {"b": 2}]
    assert problems[0].startswith(f"{path}:2: skipped")
    assert problems[1].startswith(f"{path}:4: skipped") and "cut off" in problems[1]


def test_trim_cut_line(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text('{"a": 1}\n{"b": ')
    assert traces.trim_cut_line(path) and path.read_text() == '{"a": 1}\n'
    path.write_text('{"a": 1}\n{"b": 2}')
    assert not traces.trim_cut_line(path) and path.read_text() == '{"a": 1}\n{"b": 2}\n'


HOSTILE_LINES = {
    "nested 100,000 deep": ("[" * 100_000 + "]" * 100_000, "nested deeper than 100"),
    "an object nested 2,000 deep": (
        '{"agent": "x", "question_id": "q", "a": ' + "[" * 2_000 + "]" * 2_000 + "}",
        "nested deeper than 100",
    ),
    "a 5,000-digit integer": ('{"agent": "x", "question_id": "q", "em": ' + "7" * 5_000 + "}",
                              "an integer of 5000 digits"),
    "a lone surrogate": ('{"agent": "x", "question_id": "\\ud800"}', "lone surrogate"),
    "not UTF-8": ('{"agent": "x", "question_id": "\udcff"}', "utf-8"),
}  # fmt: skip


@pytest.mark.parametrize("label", list(HOSTILE_LINES))
def test_loads_refuses_what_a_run_file_cannot_hold(label):
    text, message = HOSTILE_LINES[label]
    with pytest.raises(ValueError, match=message):
        traces.loads(text.encode("utf-8", "surrogateescape"))


def test_loads_reads_what_rag_gym_writes():
    assert traces.loads('{"a": "\\ud83d\\ude00", "n": -' + "9" * 100 + "}") == {
        "a": "\U0001f600",
        "n": -int("9" * 100),
    }
    assert traces.loads("[" * 100 + "]" * 100) is not None
    assert traces.loads('"[[[[' + "[" * 500 + '"') == "[[[[" + "[" * 500


@pytest.mark.parametrize("label", list(HOSTILE_LINES))
def test_read_jsonl_names_a_hostile_line_under_every_policy(tmp_path, label):
    from rag_gym.evaluate import load_episodes

    text, message = HOSTILE_LINES[label]
    path = tmp_path / "episodes.jsonl"
    good = '{"agent": "x", "question_id": "q1"}\n'
    path.write_bytes((good + text + "\n" + good).encode("utf-8", "surrogateescape"))
    records, problems = traces.read_jsonl(path, keys=("agent", "question_id"))
    assert [line for _, line in records] == [1, 3]
    assert len(problems) == 1 and problems[0].startswith(f"{path}:2: skipped")
    assert re.search(message, problems[0], re.I)
    with pytest.raises(traces.BadLine, match=f"{re.escape(str(path))}:2: expected JSON"):
        traces.read_jsonl(path, "strict")
    # --resume reads the file under the repair policy: an error naming the line, no traceback
    with pytest.raises(ValueError, match=f"{re.escape(str(path))}:2: .*delete that line"):
        load_episodes(path)


def test_a_hostile_cut_last_line_is_trimmed(tmp_path):
    path = tmp_path / "steps.jsonl"
    path.write_text('{"a": 1}\n' + "[" * 100_000)
    assert traces.trim_cut_line(path) and path.read_text() == '{"a": 1}\n'

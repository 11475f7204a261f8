"""The evaluator: pinned sample, run folder, leaderboard numbers, failures, reproducibility."""

from __future__ import annotations

import csv
import json
import re
import threading

import pytest

from rag_gym.baselines import make_agent
from rag_gym.evaluate import EvalConfig, evaluate, sample_indices
from tests.conftest import SMALL_WORLD, EchoLM


def oracle_reply(answers: dict[str, str]):
    """A fake LM that answers correctly: it finds the question in the prompt."""

    def reply(prompt) -> str:
        text = prompt[-1]["content"]
        question = re.search(r"Question: (.*)", text).group(1)
        return f"Answer: {answers[question]}."

    return reply


class TurnTakingLM(EchoLM):
    """A fake backend that batches concurrent clients, as ``TransformersLM`` does: each client
    runs in a thread of its own, one at a time, and a ``generate`` call hands the turn to the next
    living client (round robin), so the episodes of different slots interleave."""

    concurrent_clients = True

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.turns: list[int] = []  # which client asked, call by call
        self._local = threading.local()

    def run_clients(self, clients):
        cond, alive, turn, local = threading.Condition(), set(range(len(clients))), [0], self._local

        def pass_turn(i: int) -> None:
            if alive:
                turn[0] = min((j for j in alive if j > i), default=min(alive))
                cond.notify_all()

        def take_turn_then(i: int):
            with cond:
                pass_turn(i)
                cond.wait_for(lambda: turn[0] == i)

        def body(i: int, fn) -> None:
            local.i = i
            with cond:
                cond.wait_for(lambda: turn[0] == i)
            try:
                fn()
            finally:
                with cond:
                    alive.discard(i)
                    pass_turn(i)

        self._take_turn = lambda: take_turn_then(local.i)
        threads = [threading.Thread(target=body, args=(i, c)) for i, c in enumerate(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def generate(self, prompts, config=None):
        self.turns.append(self._local.i)
        self._take_turn()
        return super().generate(prompts, config)


def config(tmp_path, **kw) -> EvalConfig:
    base = dict(
        n=12,
        seed=1,
        agents=("naive_rag", "random"),
        env_kwargs={"dataset_kwargs": SMALL_WORLD},
        out_dir=str(tmp_path),
        run_name="run",
    )
    return EvalConfig(**{**base, **kw})


def test_sample_is_pinned():
    assert sample_indices(100, 5, 0) == sample_indices(100, 5, 0)
    assert sample_indices(100, 5, 0) != sample_indices(100, 5, 1)
    assert sample_indices(3, 5, 0) == [0, 1, 2]


def test_leaderboard_numbers_and_run_folder(tmp_path):
    from rag_gym.data.synthhop import world_for

    world = world_for("default", **SMALL_WORLD)
    answers = {q.question: q.answer for q in world.questions["validation"]}
    lm = EchoLM(reply=oracle_reply(answers))
    result = evaluate(
        config(tmp_path), lambda name, env: make_agent(name, lm=lm, seed=1), command="test"
    )
    rows = {r["agent"]: r for r in result.rows}
    # naive RAG with an always-right reader: EM = F1 = 1, one search, two steps
    assert rows["naive_rag"]["em"] == 1.0 and rows["naive_rag"]["f1"] == 1.0
    assert rows["naive_rag"]["searches"] == 1.0 and rows["naive_rag"]["steps"] == 2.0
    assert rows["naive_rag"]["tokens"] == 12.0 and rows["naive_rag"]["episodes"] == 12
    assert rows["random"]["em"] < 0.5
    # recall is measured from the retrieved ids: the first hop of most questions is found
    assert 0.4 <= rows["naive_rag"]["recall"] <= 1.0
    run = tmp_path / "run"
    episodes = [json.loads(line) for line in (run / "episodes.jsonl").read_text().splitlines()]
    assert len(episodes) == 24 and {e["agent"] for e in episodes} == {"naive_rag", "random"}
    assert [e["question_id"] for e in episodes[:12]] == [e["question_id"] for e in episodes[12:]]
    protocol = json.loads((run / "protocol.json").read_text())
    assert protocol["question_ids"] == [e["question_id"] for e in episodes[:12]]
    assert (
        protocol["k"] == 3 and protocol["corpus_mode"] == "corpus" and protocol["command"] == "test"
    )
    with open(run / "leaderboard.csv") as f:
        table = list(csv.DictReader(f))
    assert [r["agent"] for r in table] == ["naive_rag", "random"] and float(table[0]["em"]) == 1.0
    assert (run / "leaderboard.md").read_text().startswith("| agent | EM | F1 |")


def test_same_protocol_same_results(tmp_path):
    runs = []
    for name in ("a", "b"):
        result = evaluate(
            config(tmp_path, run_name=name, agents=("random",)),
            lambda n, env: make_agent(n, seed=1),
        )
        runs.append([{k: v for k, v in e.items() if k != "seconds"} for e in result.episodes])
    assert runs[0] == runs[1]


def test_backend_failure_is_counted_not_fatal(tmp_path):
    lm = EchoLM(fail=True)
    result = evaluate(
        config(tmp_path, agents=("naive_rag",), n=4), lambda n, env: make_agent(n, lm=lm)
    )
    (row,) = result.rows
    assert row["errors"] == 4 and row["episodes"] == 4 and row["em"] == 0.0
    assert all("TimeoutError: backend timed out" in e["error"] for e in result.episodes)


def test_episodes_in_flight_equal_lockstep_batches(tmp_path):
    reply = lambda p: re.sub(r"\W+", " ", p[-1]["content"])[-30:]  # noqa: E731 (prompt only)
    runs = []
    for name, lm in (("lockstep", EchoLM(reply=reply)), ("flight", TurnTakingLM(reply=reply))):
        result = evaluate(
            config(tmp_path, run_name=name, agents=("ircot", "naive_rag"), batch_size=4),
            lambda n, env, lm=lm: make_agent(n, lm=lm),
        )
        runs.append([{k: v for k, v in e.items() if k != "seconds"} for e in result.episodes])
    assert runs[0] == runs[1] and len(runs[0]) == 24
    assert all(len(prompts) == 1 for prompts in lm.calls)  # one request per episode step
    assert sorted(set(lm.turns)) == [0, 1, 2, 3]  # the four slots took turns


def test_backend_failure_in_flight_is_counted_not_fatal(tmp_path):
    lm = TurnTakingLM(fail=True)
    result = evaluate(
        config(tmp_path, agents=("naive_rag",), n=6, batch_size=3),
        lambda n, env: make_agent(n, lm=lm),
    )
    (row,) = result.rows
    assert row["errors"] == 6 and row["episodes"] == 6
    assert all("TimeoutError: backend timed out" in e["error"] for e in result.episodes)


def test_config_errors(tmp_path):
    with pytest.raises(ValueError, match="did you mean 'rag_gym/SynthHop-v0'"):
        EvalConfig(env_id="rag_gym/SynthHop-v9")
    with pytest.raises(ValueError, match="did you mean 'random'"):
        EvalConfig(agents=("randm",))
    with pytest.raises(ValueError, match="expected n >= 1"):
        EvalConfig(n=0)


def test_track_logs_offline_under_the_run_folder(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="needs wandb: pip install 'rag-gym[track]'")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    result = evaluate(
        config(tmp_path, agents=("random",), n=3, run_name="tracked"),
        lambda n, env: make_agent(n, seed=1),
        track=True,
    )
    offline = list((tmp_path / "tracked" / "wandb").glob("offline-run-*"))
    assert len(offline) == 1 and any(offline[0].rglob("*.wandb"))
    assert result.rows[0]["episodes"] == 3


def test_plots_are_written(tmp_path):
    evaluate(config(tmp_path, agents=("random",), n=3), lambda n, env: make_agent(n, seed=1))
    for name in ("em_f1.png", "accuracy_vs_retrievals.png"):
        assert (tmp_path / "run" / name).read_bytes()[:4] == b"\x89PNG"

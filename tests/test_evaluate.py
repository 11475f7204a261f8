"""The evaluator: pinned sample, run folder, leaderboard numbers, failures, reproducibility."""

from __future__ import annotations

import csv
import json
import re
import threading
import warnings

import pytest

from rag_gym.baselines import make_agent
from rag_gym.evaluate import (
    EvalConfig,
    RunInterrupted,
    check_run_dir,
    default_run_name,
    evaluate,
    load_episodes,
    run_dir_of,
    sample_indices,
)
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
    assert (run / "leaderboard.md").read_text().startswith("| agent | EM | EM 95% CI | F1 |")


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


@pytest.mark.slow
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


# -- nothing lost: episodes are saved as they end, a stopped run resumes, folders are kept --


class StopAfter:
    """Builds agents; the first one built raises KeyboardInterrupt (Ctrl-C) at its
    ``calls``-th step, as a user's Ctrl-C would land mid-run."""

    def __init__(self, calls: int, **agent_kwargs) -> None:
        self.calls, self.agent_kwargs, self.armed = calls, agent_kwargs, True

    def __call__(self, name, env):
        agent = make_agent(name, seed=1, **self.agent_kwargs)
        if self.armed and name == "random":
            self.armed = False
            act, count = agent.act_batch, [0]

            def act_batch(*args):
                count[0] += 1
                if count[0] == self.calls:
                    raise KeyboardInterrupt
                return act(*args)

            agent.act_batch = act_batch
        return agent


def strip_times(episodes):
    return [{k: v for k, v in e.items() if k != "seconds"} for e in episodes]


def strip_row_times(rows):
    """Leaderboard rows without the timing column, as JSON text (so NaN equals NaN)."""
    return json.dumps([{k: v for k, v in r.items() if k != "seconds"} for r in rows])


def read_episodes(run):
    return [json.loads(line) for line in (run / "episodes.jsonl").read_text().splitlines()]


def test_interrupted_run_keeps_its_episodes_and_resumes_to_the_same_leaderboard(tmp_path):
    agents = ("random", "direct")  # direct fails on its own: errors are kept as they are

    class Broken(EchoLM):  # an error of the agent's, not a backend's (a resume keeps it)
        def generate(self, prompts, config=None):
            raise ValueError("the prompt is too long")

    lm = Broken()
    full = evaluate(
        config(tmp_path, run_name="full", agents=agents, batch_size=3),
        lambda n, env: make_agent(n, lm=lm, seed=1),
    )
    with pytest.raises(RunInterrupted, match=r"SIGINT: \d+ finished episodes") as info:
        evaluate(
            config(tmp_path, run_name="cut", agents=agents, batch_size=3),
            StopAfter(5, lm=lm),
        )
    run = tmp_path / "cut"
    assert info.value.run_dir == run
    saved = read_episodes(run)
    assert 0 < len(saved) == info.value.saved < 12  # the finished ones, flushed as they ended
    with open(run / "leaderboard.csv") as f:
        partial = list(csv.DictReader(f))
    assert [r["agent"] for r in partial] == ["random", "direct"]
    assert [int(r["episodes"]) for r in partial] == [len(saved), 0]
    resumed = evaluate(
        config(tmp_path, run_name="cut", agents=agents, batch_size=2),  # batch size may differ
        lambda n, env: make_agent(n, lm=lm, seed=1),
        resume=True,
    )
    assert strip_times(resumed.episodes) == strip_times(full.episodes)
    assert strip_times(read_episodes(run)) == strip_times(read_episodes(tmp_path / "full"))
    assert strip_row_times(resumed.rows) == strip_row_times(full.rows)
    assert resumed.rows[1]["errors"] == 12
    # the episodes saved before the interrupt were not played again
    assert strip_times(read_episodes(run)[: len(saved)]) != [] and all(
        e in strip_times(read_episodes(run)) for e in strip_times(saved)
    )


def test_resume_trims_a_line_cut_by_a_kill(tmp_path):
    full = evaluate(config(tmp_path, run_name="full", agents=("random",)), StopAfter(10**9))
    with pytest.raises(RunInterrupted):
        evaluate(config(tmp_path, agents=("random",), batch_size=2), StopAfter(4))
    path = tmp_path / "run" / "episodes.jsonl"
    n_saved = len(path.read_text().splitlines())
    with open(path, "a") as f:
        f.write('{"question_id": "q-cut", "agent": "ran')  # a kill -9 mid-write
    with pytest.warns(RuntimeWarning, match="last line was cut off"):
        resumed = evaluate(config(tmp_path, agents=("random",)), StopAfter(10**9), resume=True)
    assert n_saved < 12 and strip_times(resumed.episodes) == strip_times(full.episodes)
    assert strip_times(read_episodes(tmp_path / "run")) == strip_times(full.episodes)


def test_a_damaged_episode_line_is_named(tmp_path):
    evaluate(config(tmp_path, agents=("random",), n=3), StopAfter(10**9))
    path = tmp_path / "run" / "episodes.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], "{oops", lines[2]]) + "\n")
    with pytest.raises(ValueError, match=r"episodes.jsonl:2: expected an episode record"):
        load_episodes(path)


def test_resume_refuses_another_protocol_but_may_add_agents(tmp_path):
    with pytest.raises(RunInterrupted):
        evaluate(config(tmp_path, agents=("random",)), StopAfter(3))
    factory = lambda n, env: make_agent(n, lm=EchoLM(), seed=1)  # noqa: E731
    for change, message in (
        ({"n": 6}, r"n 6 \(the run has 12\)"),
        ({"seed": 2}, r"seed 2 \(the run has 1\)"),
        ({"split": "test"}, r"split 'test'"),
        ({"env_kwargs": {"dataset_kwargs": {**SMALL_WORLD, "seed": 5}}}, "env_kwargs"),
        ({"agents": ("naive_rag",)}, r"no random \(the run has them; agents can only be added\)"),
    ):
        with pytest.raises(ValueError, match=message):
            evaluate(config(tmp_path, **change), factory, resume=True)
    # an LM agent joins a run that had none
    both = evaluate(
        config(tmp_path, agents=("random", "naive_rag"), lm_spec="echo"), factory, resume=True
    )
    reference = evaluate(config(tmp_path, run_name="ref", agents=("random", "naive_rag")), factory)
    assert strip_row_times(both.rows) == strip_row_times(reference.rows)
    assert strip_times(both.episodes) == strip_times(reference.episodes)
    protocol = json.loads((tmp_path / "run" / "protocol.json").read_text())
    assert list(protocol["agents"]) == ["random", "naive_rag"] and protocol["lm_spec"] == "echo"
    with pytest.raises(ValueError, match=r"lm 'other' \(the run has 'echo'\)"):
        evaluate(
            config(tmp_path, agents=("random", "naive_rag"), lm_spec="other"),
            factory,
            resume=True,
        )


def test_reset_and_step_faults_are_recorded_and_the_run_goes_on(tmp_path, monkeypatch):
    from rag_gym.envs.search import SearchEnv

    run = evaluate(config(tmp_path, run_name="a", agents=("random",)), StopAfter(10**9))
    bad_reset, bad_step = run.episodes[3]["question_id"], run.episodes[7]["question_id"]
    reset, step = SearchEnv.reset, SearchEnv.step

    def broken_reset(self, *, seed=None, options=None):
        if options["question_id"] == bad_reset:
            raise KeyError("record 288 has no 'question'")
        return reset(self, seed=seed, options=options)

    def broken_step(self, action):
        if self._example.id == bad_step:
            raise IndexError("index 7 is out of bounds")
        return step(self, action)

    monkeypatch.setattr(SearchEnv, "reset", broken_reset)
    monkeypatch.setattr(SearchEnv, "step", broken_step)
    result = evaluate(config(tmp_path, run_name="b", agents=("random",)), StopAfter(10**9))
    (row,) = result.rows
    assert row["episodes"] == 12 and row["errors"] == 2
    errors = {e["question_id"]: e["error"] for e in result.episodes if e["error"]}
    assert errors == {
        bad_reset: "KeyError: \"record 288 has no 'question'\"",
        bad_step: "IndexError: index 7 is out of bounds",
    }
    same = [a for a, b in zip(run.episodes, result.episodes, strict=True) if not b["error"]]
    assert strip_times(same) == strip_times([e for e in result.episodes if not e["error"]])


def test_a_run_folder_is_never_overwritten_silently(tmp_path):
    evaluate(config(tmp_path, agents=("random",), n=3), StopAfter(10**9))
    with pytest.raises(FileExistsError, match="already holds a run: pass --resume"):
        evaluate(config(tmp_path, agents=("random",), n=3), StopAfter(10**9))
    (tmp_path / "run" / "mine.txt").write_text("kept until --overwrite")
    evaluate(config(tmp_path, agents=("random",), n=4), StopAfter(10**9), overwrite=True)
    assert not (tmp_path / "run" / "mine.txt").exists()
    assert len(read_episodes(tmp_path / "run")) == 4
    # a folder that is not a run folder is never deleted, not even with overwrite
    notes = tmp_path / "notes"
    (notes / "sub").mkdir(parents=True)
    (notes / "notes.txt").write_text("x")
    for overwrite in (False, True):
        with pytest.raises(FileExistsError, match="is not a rag-gym run folder"):
            evaluate(
                config(tmp_path, agents=("random",), n=3, run_name="notes"),
                StopAfter(10**9),
                overwrite=overwrite,
            )
    assert (notes / "notes.txt").read_text() == "x" and (notes / "sub").is_dir()
    # an empty folder is fine
    (tmp_path / "empty").mkdir()
    evaluate(config(tmp_path, agents=("random",), n=2, run_name="empty"), StopAfter(10**9))
    with pytest.raises(ValueError, match="expected resume or overwrite, got both"):
        check_run_dir(config(tmp_path), resume=True, overwrite=True)
    with pytest.raises(FileNotFoundError, match=r"has no protocol\.json"):
        evaluate(config(tmp_path, run_name="nothing"), StopAfter(10**9), resume=True)
    with pytest.raises(ValueError, match="expected the name of the run to resume"):
        check_run_dir(config(tmp_path, run_name=None), resume=True)


def test_default_run_names_are_unique_and_sortable(tmp_path):
    cfg = config(tmp_path, run_name=None, agents=("random",), n=2)
    names = [default_run_name(cfg) for _ in range(1000)]
    assert len(set(names)) == 1000 and names[0].startswith("SynthHop-v0__validation__1__")
    assert sorted(names, key=lambda s: s.rsplit("-", 1)[0]) == names  # by start time
    first = evaluate(cfg, StopAfter(10**9)).run_dir
    second = evaluate(cfg, StopAfter(10**9)).run_dir  # within the same second: a second folder
    assert first != second and first.parent == second.parent == tmp_path
    assert len(read_episodes(first)) == len(read_episodes(second)) == 2


@pytest.mark.parametrize("name", ["../x", "../../x", "/tmp/elsewhere", "a/../..", "", "."])
def test_run_name_must_stay_inside_out(tmp_path, name):
    with pytest.raises(
        ValueError, match=r"expected run_name \(--run-name\) to name a folder inside"
    ):
        config(tmp_path / "runs", run_name=name)
    assert not (tmp_path / "x").exists()


def test_run_name_inside_out_is_accepted(tmp_path):
    assert run_dir_of(tmp_path, "sweep/a") == tmp_path / "sweep" / "a"
    assert run_dir_of(tmp_path, str(tmp_path / "b")) == tmp_path / "b"


def test_out_dir_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "f").write_text("x")
    for out in (tmp_path / "f", tmp_path / "f" / "below"):
        with pytest.raises(ValueError, match=r"expected out_dir \(--out\) to be a folder"):
            config(out)
    assert (tmp_path / "f").read_text() == "x"


def test_env_kwargs_reward_preset_builds_the_paper_stack_outside_the_time_limit():
    from rag_gym.evaluate import make_env

    env = make_env(
        "rag_gym/SynthHop-v0",
        {"reward_preset": "eval_rar", "max_episode_steps": 5, "dataset_kwargs": SMALL_WORLD},
    )
    assert env.spec.max_episode_steps == 5
    assert [w.name for w in env.spec.additional_wrappers][-1] == "EvaluationReward"
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step({"type": 1, "text": "surely wrong"})
    assert terminated and reward == 0.0
    assert set(info["reward_terms"]) == {"answer", "evaluation"}


def test_trained_agents_play_first_and_the_run_is_written_in_its_own_order(tmp_path):
    """``search_r1:RUN`` plays first (its progress shows first), yet every agent's episodes and
    row equal those of a run of that agent alone, and the files follow the run's order."""
    from rag_gym.agents.provenance import SeenQuestionsWarning
    from rag_gym.data.synthhop import world_for
    from rag_gym.evaluate.runner import play_order

    world = world_for("default", **SMALL_WORLD)
    answers = {q.question: q.answer for q in world.questions["validation"]}

    def reply(prompt) -> str:  # naive_rag's reader (chat) or search_r1's turns (text)
        text = prompt if isinstance(prompt, str) else prompt[-1]["content"]
        question = re.search(r"Question: (.*)", text).group(1).strip()
        return f"Answer: {answers[question]}." if isinstance(prompt, list) else "<answer>x"

    lm = EchoLM(reply=reply)

    def factory(name, env):  # "search_r1:ckpt" stands for a trained agent: untrained here
        return make_agent("search_r1" if name.startswith("search_r1") else name, lm=lm, seed=1)

    agents = ("naive_rag", "random", "search_r1:ckpt")
    assert play_order(agents) == ["search_r1:ckpt", "naive_rag", "random"]
    calls = []
    with pytest.warns(SeenQuestionsWarning, match="could not check"):
        result = evaluate(
            config(tmp_path, agents=agents, batch_size=3),
            factory,
            progress=lambda *args: calls.append(args),
        )
    played = list(dict.fromkeys(c[0] for c in calls))
    assert played == ["search_r1:ckpt", "naive_rag", "random"]
    # the running EM: None before the first episode, then the agent's mean EM so far
    assert calls[0] == ("search_r1:ckpt", 0, 12, None)
    for name in agents:
        mine = [c for c in calls if c[0] == name]
        assert [c[1] for c in mine] == list(range(13)), name
        row = next(r for r in result.rows if r["agent"] == name)
        assert mine[-1][3] == pytest.approx(row["em"]), name
    naive = [c[3] for c in calls if c[0] == "naive_rag"]
    assert naive[1:] == [1.0] * 12  # its oracle reader is right every time
    # the files and the rows follow the run's order
    assert [r["agent"] for r in result.rows] == list(agents)
    saved = read_episodes(tmp_path / "run")
    assert [e["agent"] for e in saved] == [a for a in agents for _ in range(12)]
    with open(tmp_path / "run" / "leaderboard.csv") as f:
        assert [r["agent"] for r in csv.DictReader(f)] == list(agents)
    assert list(json.loads((tmp_path / "run" / "protocol.json").read_text())["agents"]) == list(
        agents
    )
    # each agent's episodes and row are those of a run of that agent alone
    for name in agents:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            alone = evaluate(config(tmp_path, agents=(name,), run_name=f"alone-{name}"), factory)
        assert strip_times(alone.episodes) == strip_times(
            [e for e in result.episodes if e["agent"] == name]
        ), name
        assert strip_row_times(alone.rows) == strip_row_times(
            [r for r in result.rows if r["agent"] == name]
        ), name

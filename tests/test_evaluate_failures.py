"""What the evaluator does when something outside the agent fails: a backend that cannot be
reached stops the run (resumable), episodes failed for such a reason (an HTTP failure of the
backend included) are replayed by a resume, a judge without a verdict leaves its value missing,
text that is not Unicode fails its episode and nothing else, a damaged protocol and a signal
during the final write or the report are handled, and the command line exits non-zero when an
agent failed every episode or results are missing."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from typer.testing import CliRunner

from rag_gym.baselines import make_agent
from rag_gym.cli import app
from rag_gym.evaluate import EvalConfig, RunInterrupted, evaluate, load_episodes
from rag_gym.evaluate.runner import JudgeWarning, MissingResultsWarning
from tests.conftest import SMALL_WORLD, EchoLM, first_fast
from tests.generation.openai_stand_in import FAILURES, StandIn

runner = CliRunner()


def config(tmp_path, **kw) -> EvalConfig:
    base = dict(
        n=4,
        seed=1,
        agents=("naive_rag",),
        env_kwargs={"dataset_kwargs": SMALL_WORLD},
        out_dir=str(tmp_path),
        run_name="run",
    )
    return EvalConfig(**{**base, **kw})


def strip_times(episodes):
    return [{k: v for k, v in e.items() if k != "seconds"} for e in episodes]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ChatServer:
    """An OpenAI-compatible stand-in on 127.0.0.1: every chat completion answers ``reply``, or
    the HTTP ``status`` when it is not 200."""

    def __init__(self, port: int, reply: str = "Answer: north.", status: int = 200) -> None:
        outer = self
        self.requests = 0

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers["Content-Length"]))
                outer.requests += 1
                body = {
                    "choices": [{"message": {"content": reply}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 5, "completion_tokens": 2},
                }
                data = json.dumps(body if status == 200 else {"error": "bad request"}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def evaluate_cli(tmp_path, *args: str):
    world = json.dumps({"dataset_kwargs": SMALL_WORLD})
    return runner.invoke(
        app,
        ["evaluate", "--env-kwargs", world, "--out", str(tmp_path), "--no-progress", *args],
    )


def test_an_unreachable_llm_backend_stops_the_run_and_resume_finishes_it(tmp_path):
    port = free_port()
    lm = f"openai:m@http://127.0.0.1:{port}/v1"
    run = tmp_path / "r"
    stopped = evaluate_cli(
        tmp_path, "--agents", "naive_rag", "--lm", lm, "--n", "3", "--run-name", "r"
    )
    assert stopped.exit_code != 0, stopped.output
    assert "cannot reach" in stopped.output and f"--resume {run}" in stopped.output
    assert load_episodes(run / "episodes.jsonl") == []  # nothing recorded as done
    again = runner.invoke(app, ["evaluate", "--resume", str(run), "--no-progress"])
    assert again.exit_code != 0 and "cannot reach" in again.output
    with ChatServer(port) as server:
        done = runner.invoke(app, ["evaluate", "--resume", str(run), "--no-progress"])
    assert done.exit_code == 0, done.output
    episodes = load_episodes(run / "episodes.jsonl")
    assert len(episodes) == 3 and all(e["error"] is None for e in episodes)
    assert server.requests >= 3


def test_a_backend_that_fails_every_episode_exits_non_zero(tmp_path):
    port = free_port()
    with ChatServer(port, status=400):
        result = evaluate_cli(
            tmp_path,
            *("--agents", "naive_rag,random", "--lm", f"openai:m@http://127.0.0.1:{port}/v1"),
            *("--n", "3", "--run-name", "r"),
        )
    assert result.exit_code == 1, result.output
    assert "every episode of naive_rag failed" in result.output and "answered 400" in result.output
    rows = (tmp_path / "r" / "leaderboard.csv").read_text()
    assert "naive_rag" in rows and "random" in rows  # the run folder is complete


def test_episodes_failed_outside_the_agent_are_replayed_by_resume(tmp_path):
    failed = evaluate(config(tmp_path), lambda n, env: make_agent(n, lm=EchoLM(fail=True)))
    assert failed.rows[0]["errors"] == 4
    assert all(e["error"].startswith("TimeoutError") for e in failed.episodes)
    factory = lambda n, env: make_agent(n, lm=EchoLM(reply="Answer: north."))  # noqa: E731
    resumed = evaluate(config(tmp_path), factory, resume=True)
    reference = evaluate(config(tmp_path, run_name="ref"), factory)
    assert resumed.rows[0]["errors"] == 0
    assert strip_times(resumed.episodes) == strip_times(reference.episodes)
    lines = (tmp_path / "run" / "episodes.jsonl").read_text().splitlines()
    assert len(lines) == 4  # each episode once: the failed records were replaced


def test_an_agent_error_is_kept_by_resume(tmp_path):
    """A ValueError from the agent's model (not a backend's ``BackendError``) is the agent's:
    not replayed."""

    class Broken(EchoLM):
        def generate(self, prompts, config=None):
            if self.fail:
                raise ValueError("the reply has no usable choice")
            return super().generate(prompts, config)

    evaluate(config(tmp_path, n=2), lambda n, env: make_agent(n, lm=Broken(fail=True)))
    resumed = evaluate(
        config(tmp_path, n=2), lambda n, env: make_agent(n, lm=Broken()), resume=True
    )
    assert [e["error"] for e in resumed.episodes] == [
        "ValueError: the reply has no usable choice"
    ] * 2


def test_a_question_that_is_not_unicode_fails_its_episode_and_the_run_goes_on(
    tmp_path, monkeypatch
):
    """A question holding a lone surrogate (from a source no loader checked) fails its own
    episode, named; the run, its files and a resume go on."""
    from rag_gym.envs.search import SearchEnv

    factory = lambda n, env: make_agent(n, lm=EchoLM(reply="Answer: x."))  # noqa: E731
    clean = evaluate(config(tmp_path, run_name="clean"), factory)
    bad_id = clean.episodes[1]["question_id"]
    reset = SearchEnv.reset

    def lone_reset(self, *, seed=None, options=None):
        obs, info = reset(self, seed=seed, options=options)
        if info["question_id"] == bad_id:
            info = {**info, "question": info["question"] + " \udc80"}
        return obs, info

    monkeypatch.setattr(SearchEnv, "reset", lone_reset)
    result = evaluate(config(tmp_path), factory)
    errors = {e["question_id"]: e["error"] for e in result.episodes if e["error"]}
    assert list(errors) == [bad_id] and result.rows[0]["episodes"] == 4
    assert errors[bad_id].startswith("UnicodeEncodeError: the episode's question holds text")
    text = (tmp_path / "run" / "episodes.jsonl").read_bytes().decode("utf-8")  # valid UTF-8
    assert len(text.splitlines()) == 4 and "\ufffd" in text
    monkeypatch.setattr(SearchEnv, "reset", reset)
    resumed = evaluate(config(tmp_path), factory, resume=True)
    assert strip_times(resumed.episodes) == strip_times(result.episodes)  # nothing replayed
    same = [e for e in result.episodes if e["question_id"] != bad_id]
    assert strip_times(same) == strip_times(
        [e for e in clean.episodes if e["question_id"] != bad_id]
    )


def test_a_reply_that_is_not_unicode_is_kept_out_of_the_trace_files(tmp_path):
    """The env turns a lone surrogate of a reply into U+FFFD; its raw text in the trace is
    written the same way, and the episode stands."""
    calls = []

    def lone(prompt):  # the second reply holds a lone surrogate
        calls.append(1)
        return "Answer: bad \ud800 text." if len(calls) == 2 else "Answer: x."

    result = evaluate(config(tmp_path), lambda n, env: make_agent(n, lm=EchoLM(reply=lone)))
    assert result.rows[0]["errors"] == 0 and result.rows[0]["episodes"] == 4
    steps = (tmp_path / "run" / "steps.jsonl").read_bytes().decode("utf-8")
    assert "bad \ufffd text" in steps


def test_a_lone_surrogate_in_the_data_file_is_refused_naming_the_record(tmp_path):
    data = tmp_path / "b.jsonl"
    rows = [
        {"id": "a", "question": "Where is Vell?", "answer": "north"},
        {"id": "b", "question": "Who is <LONE>?", "answer": "Ada"},
    ]
    data.write_text(
        "".join(json.dumps(r) + "\n" for r in rows).replace("<LONE>", "\\ud800"),
        encoding="utf-8",
    )
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"id": "p", "contents": "T\nVell is north."}) + "\n")
    result = runner.invoke(
        app,
        [
            *("evaluate", "--env", "rag_gym/Bamboogle-v0", "--split", "test"),
            *("--data-path", str(data), "--corpus", str(corpus), "--agents", "random"),
            *("--out", str(tmp_path / "runs"), "--no-progress"),
        ],
    )
    assert result.exit_code == 2, result.output
    assert "b.jsonl, line 2, field 'question': expected valid Unicode text" in result.output


def test_sigterm_during_the_final_write_leaves_a_leaderboard_and_a_resume(tmp_path, monkeypatch):
    from rag_gym.evaluate import leaderboard as ev  # write_run's module

    factory = lambda n, env: make_agent(n, seed=1)  # noqa: E731
    write_plots = ev.write_plots

    def killed(*args, **kwargs):
        raise KeyboardInterrupt("SIGTERM")

    monkeypatch.setattr(ev, "write_plots", killed)
    with pytest.raises(RunInterrupted, match="SIGTERM: 4 finished episodes") as info:
        evaluate(config(tmp_path, agents=("random",)), factory)
    assert info.value.reason == "SIGTERM"
    board = (tmp_path / "run" / "leaderboard.md").read_text()
    assert "| random |" in board and "| 4 |" in board
    monkeypatch.setattr(ev, "write_plots", write_plots)
    resumed = evaluate(config(tmp_path, agents=("random",)), factory, resume=True)
    assert len(resumed.episodes) == 4 and (tmp_path / "run" / "em_f1.png").is_file()


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda p: p.pop("config"), "no 'config' object"),
        (lambda p: p.update(agents=list(p["agents"])), "agents as a list"),
        (lambda p: p["config"].update(agents="random"), "config.agents random"),
    ],
)
def test_a_damaged_protocol_is_named_on_resume(tmp_path, edit, message):
    factory = lambda n, env: make_agent(n, seed=1)  # noqa: E731
    evaluate(config(tmp_path, agents=("random",), n=2), factory)
    path = tmp_path / "run" / "protocol.json"
    protocol = json.loads(path.read_text())
    edit(protocol)
    path.write_text(json.dumps(protocol))
    with pytest.raises(ValueError, match=rf"protocol\.json: expected a protocol .*{message}"):
        evaluate(config(tmp_path, agents=("random",), n=2), factory, resume=True)
    result = runner.invoke(app, ["evaluate", "--resume", str(tmp_path / "run"), "--no-progress"])
    assert result.exit_code == 2 and message in result.output, result.output


def test_a_split_in_env_kwargs_must_be_the_split(tmp_path):
    with pytest.raises(ValueError, match=r"got split 'validation' and env_kwargs split 'train'"):
        config(tmp_path, env_kwargs={"split": "train"})
    assert config(tmp_path, env_kwargs={"split": "validation"}).split == "validation"
    result = runner.invoke(
        app, ["evaluate", "--env-kwargs", '{"split": "train"}', "--out", str(tmp_path)]
    )
    assert result.exit_code == 2 and "drop 'split' from env_kwargs" in result.output


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"k": ' + "7" * 5000 + "}", "env_kwargs to hold numbers of at most 4,300"),
        ('{"k": ' + "[" * 50_000 + "]" * 50_000 + "}", "env_kwargs to be JSON nested"),
        ("[1, 2]", "JSON object"),
    ],
)
def test_env_kwargs_that_python_cannot_read_get_a_clear_error(tmp_path, text, message):
    from rag_gym.train.options import dict_option

    result = runner.invoke(app, ["evaluate", "--env-kwargs", text, "--out", str(tmp_path)])
    assert result.exit_code == 2, result.output[-500:]
    assert message in result.output and isinstance(result.exception, (SystemExit, type(None)))
    # the training configs read their env_kwargs text with the same parser
    with pytest.raises((TypeError, ValueError), match=message.split(", got")[0]):
        dict_option("env_kwargs", text)


def test_synth_and_compare_name_a_bad_output_path(tmp_path):
    existing = tmp_path / "world.txt"
    existing.write_text("mine")
    result = runner.invoke(app, ["synth", "--out", str(existing), "--passages", "2000"])
    assert result.exit_code == 2 and "expected --out to be a folder" in result.output
    assert existing.read_text() == "mine"
    result = runner.invoke(
        app,
        ["compare", str(tmp_path), "--a", "x", "--b", "y", "--json", "/missing/dir/x.json"],
    )
    assert result.exit_code == 2 and "expected --json in an existing folder" in result.output


def test_an_unreachable_backend_of_concurrent_clients_stops_the_run(tmp_path):
    """The same with a backend that batches concurrent clients (transformers): the error of
    one client stops them all and is raised, the episodes finished before are kept."""
    from tests.test_evaluate import TurnTakingLM

    class Unreachable(TurnTakingLM):
        down = True

        def generate(self, prompts, config=None):
            if self.down and len(self.turns) >= 6:
                self.turns.append(-1)
                raise ConnectionError("cannot reach http://127.0.0.1:1/v1: refused")
            return super().generate(prompts, config)

    lm = Unreachable()
    with pytest.raises(ConnectionError, match="cannot reach") as info:
        evaluate(config(tmp_path, n=8, batch_size=2), lambda n, env: make_agent(n, lm=lm))
    assert any("--resume" in note for note in info.value.__notes__)
    saved = load_episodes(tmp_path / "run" / "episodes.jsonl")
    assert 0 < len(saved) < 8 and all(e["error"] is None for e in saved)
    lm = Unreachable()
    lm.down = False  # the server is back
    resumed = evaluate(
        config(tmp_path, n=8, batch_size=2), lambda n, env: make_agent(n, lm=lm), resume=True
    )
    assert len(resumed.episodes) == 8 and resumed.rows[0]["errors"] == 0


def openai_factory(url: str):
    from rag_gym.generation.openai_compat import OpenAICompatibleLM

    lm = OpenAICompatibleLM("m", base_url=url, max_retries=0)
    return lambda n, env: make_agent(n, lm=lm)


def rows_without_times(result):
    """The leaderboard rows but their timing, NaN as None (NaN equals nothing)."""
    return [{k: None if v != v else v for k, v in r.items() if k != "seconds"} for r in result.rows]


@pytest.mark.parametrize("mode", first_fast(list(FAILURES)))
def test_episodes_failed_for_an_http_failure_of_the_backend_are_replayed_by_resume(tmp_path, mode):
    """401, 404, an HTML page, invalid JSON, a body not UTF-8, a broken status line, a reply
    without choices or with a content that is not text: each episode is recorded failed with a
    BackendError; once the backend works, a resume plays them again and the leaderboard is an
    uninterrupted run's."""
    with StandIn(mode=mode) as server:
        factory = openai_factory(server.url)
        with pytest.warns(MissingResultsWarning, match="4 episodes failed for their backend"):
            failed = evaluate(config(tmp_path), factory)
        assert failed.rows[0]["errors"] == 4
        assert all(e["error"].startswith(f"BackendError: {server.url}") for e in failed.episodes)
        server.mode = "ok"
        resumed = evaluate(config(tmp_path), factory, resume=True)
        reference = evaluate(config(tmp_path, run_name="ref"), factory)
    assert resumed.rows[0]["errors"] == 0
    assert strip_times(resumed.episodes) == strip_times(reference.episodes)
    assert rows_without_times(resumed) == rows_without_times(reference)


def test_a_backend_that_keeps_failing_stops_the_run_and_resume_finishes_it(tmp_path):
    from rag_gym.evaluate.runner import STOP_AFTER_FAILURES

    n = STOP_AFTER_FAILURES + 4
    with StandIn(mode="401") as server:
        factory = openai_factory(server.url)
        with pytest.raises(
            ConnectionError,
            match=rf"stopped: the last {STOP_AFTER_FAILURES} episodes of naive_rag failed for "
            rf"their backend \(the last: BackendError: {server.url}/chat/completions answered 401",
        ) as info:
            evaluate(config(tmp_path, n=n, batch_size=1), factory)
        assert any("--resume" in note for note in info.value.__notes__)
        saved = load_episodes(tmp_path / "run" / "episodes.jsonl")
        assert len(saved) == STOP_AFTER_FAILURES  # the rest were never started
        server.mode = "ok"
        resumed = evaluate(config(tmp_path, n=n, batch_size=1), factory, resume=True)
        reference = evaluate(config(tmp_path, n=n, batch_size=1, run_name="ref"), factory)
    assert strip_times(resumed.episodes) == strip_times(reference.episodes)
    assert rows_without_times(resumed) == rows_without_times(reference)


def test_the_command_exits_1_with_the_resume_command_and_escapes_control_bytes(tmp_path):
    with StandIn(mode="control") as server:
        result = evaluate_cli(
            tmp_path,
            *("--agents", "naive_rag,random", "--lm", f"openai:m@{server.url}"),
            *("--n", "3", "--run-name", "r"),
        )
    assert result.exit_code == 1, result.output
    assert "3 episodes failed for their backend" in result.output
    assert f"resume with: rag-gym evaluate --resume {tmp_path / 'r'}" in result.output
    assert "answered 401: bad key\\x1b[2J\\x1b]0;owned\\x07" in result.output
    assert "\x1b" not in result.output and "\x07" not in result.output


def prediction_judge(prompt: str) -> str:
    """A judge's replies: yes when the gold answers hold the predicted answer."""
    golds = prompt.split("Gold answers: ")[1].split("\n")[0].lower()
    prediction = prompt.split("Predicted answer: ")[1].split("\n")[0].lower()
    return "Yes." if prediction and prediction in golds else "No."


def golden_factory(n, env):
    """naive_rag answering each question's gold answer for its even-numbered ones."""
    gold = {ex.question: ex.answers[0] for ex in env.unwrapped.examples}

    def reply(prompt):
        text = json.dumps(prompt)
        question = next((q for q in gold if json.dumps(q)[1:-1] in text), None)
        return f"Answer: {gold[question]}." if question and len(question) % 2 else "Answer: x."

    return make_agent(n, lm=EchoLM(reply=reply))


@pytest.mark.parametrize("mode", first_fast(["maybe", *FAILURES]))
def test_a_judge_without_a_verdict_is_missing_never_no_and_resume_asks_again(tmp_path, mode):
    from rag_gym.generation.judges import LLMAnswerJudge
    from rag_gym.generation.openai_compat import OpenAICompatibleLM

    reply = "Maybe." if mode == "maybe" else prediction_judge
    with StandIn(reply=reply, mode="ok" if mode == "maybe" else mode) as server:
        judge = LLMAnswerJudge(OpenAICompatibleLM("m", base_url=server.url, max_retries=0))
        with pytest.warns(JudgeWarning, match="the judge gave no verdict"):
            result = evaluate(config(tmp_path), golden_factory, judge=judge)
        judged = [e for e in result.episodes if e["prediction"] and e["answerable"]]
        assert judged and all(e["judge"] is None and e["judge_error"] for e in judged)
        row = result.rows[0]
        assert row["judge"] != row["judge"] and row["judge_missing"] == len(judged)  # NaN
        assert (
            "| - | " + str(len(judged)) + " |" in (tmp_path / "run" / "leaderboard.md").read_text()
        )
        server.mode, server.reply = "ok", prediction_judge
        resumed = evaluate(config(tmp_path), golden_factory, judge=judge, resume=True)
        reference = evaluate(config(tmp_path, run_name="ref"), golden_factory, judge=judge)
    assert 0 < reference.rows[0]["judge"] < 1 and reference.rows[0]["judge_missing"] == 0
    assert strip_times(resumed.episodes) == strip_times(reference.episodes)
    assert rows_without_times(resumed) == rows_without_times(reference)


def test_the_judge_column_is_over_the_judged_episodes_and_counts_the_missing():
    from rag_gym.evaluate.leaderboard import format_cell, summarise

    def episode(judge, error=None):
        return {
            **{k: 0.0 for k in ("em", "f1", "cover_em", "recall", "full_recall", "ap")},
            **dict(prediction="x", answers=["x"], answerable=True, refused=False),
            **dict(searches=1, steps=1, prompt_tokens=0, completion_tokens=0, error=None),
            "judge": judge,
            "judge_error": error,
        }

    row = summarise("a", [episode(1.0), episode(0.0), episode(None, "BackendError: 401")], 1.0)
    assert row["judge"] == 0.5 and row["judge_missing"] == 1
    old = episode(1.0)
    del old["judge_error"]  # a run without a judge, or from before judge_error
    assert format_cell("judge_missing", summarise("a", [old], 1.0)["judge_missing"]) == "-"


def test_an_unreachable_judge_stops_the_run_and_resume_finishes_it(tmp_path):
    judge = f"openai:m@http://127.0.0.1:{free_port()}/v1"
    with ChatServer(free_port()) as server:
        lm = f"openai:m@http://127.0.0.1:{server.httpd.server_address[1]}/v1"
        args = ("--agents", "naive_rag", "--lm", lm, "--judge", judge, "--n", "2")
        stopped = evaluate_cli(tmp_path, *args, "--run-name", "r")
        assert stopped.exit_code == 2, stopped.output
        assert "the judge cannot be reached: cannot reach" in stopped.output
        assert f"--resume {tmp_path / 'r'}" in stopped.output
        assert load_episodes(tmp_path / "r" / "episodes.jsonl") == []  # nothing counted as done
        port = int(judge.rsplit(":", 1)[1].split("/")[0])
        with ChatServer(port, reply="yes"):
            done = runner.invoke(
                app,
                ["evaluate", "--resume", str(tmp_path / "r"), "--judge", judge, "--no-progress"],
            )
    assert done.exit_code == 0, done.output
    episodes = load_episodes(tmp_path / "r" / "episodes.jsonl")
    assert [e["judge"] for e in episodes] == [1.0, 1.0]


def test_a_judged_run_records_its_judge_and_from_run_replays_it(tmp_path):
    """protocol.json records the judge's spec (not only that there was one), the prompt
    template, and --from-run judges again with them: the same leaderboard, but for timings."""
    import csv

    prompt = tmp_path / "prompt.txt"
    prompt.write_text("Answer briefly. {question}")
    with ChatServer(free_port()) as agent_server, ChatServer(free_port(), reply="yes") as judged:
        lm = f"openai:m@http://127.0.0.1:{agent_server.httpd.server_address[1]}/v1"
        judge = f"openai:j@http://127.0.0.1:{judged.httpd.server_address[1]}/v1"
        args = ("--agents", "naive_rag", "--lm", lm, "--judge", judge, "--n", "3")
        first = evaluate_cli(tmp_path, *args, "--prompt", str(prompt), "--run-name", "first")
        assert first.exit_code == 0, first.output
        protocol = json.loads((tmp_path / "first" / "protocol.json").read_text())
        assert protocol["judge"] == protocol["config"]["judge"] == judge
        assert protocol["config"]["prompt"] == "Answer briefly. {question}"
        asked = judged.requests
        assert asked == 3
        again = runner.invoke(
            app,
            [
                *("evaluate", "--from-run", str(tmp_path / "first"), "--out", str(tmp_path)),
                *("--run-name", "again", "--no-progress"),
            ],
        )
        assert again.exit_code == 0, again.output
        assert judged.requests == 2 * asked  # judged again, by the recorded judge
    replayed = json.loads((tmp_path / "again" / "protocol.json").read_text())
    assert (
        replayed["judge"] == judge and replayed["config"]["prompt"] == protocol["config"]["prompt"]
    )

    def rows(run: str) -> list[dict[str, str]]:
        with open(tmp_path / run / "leaderboard.csv") as f:
            return [
                {k: v for k, v in row.items() if "sec" not in k and "time" not in k}
                for row in csv.DictReader(f)
            ]

    assert rows("again") == rows("first") and rows("first")[0]["judge"] == "1.0"


DRIVER = """
import sys, time
from pathlib import Path
import rag_gym.view

def slow_report(run_dir, *args, **kwargs):
    Path(run_dir, "reporting").write_text("")
    time.sleep(60)

rag_gym.view.build_report = slow_report
from rag_gym.cli import app
sys.argv[0] = "rag-gym"
app()
"""


@pytest.mark.parametrize(("sig", "code"), [("SIGTERM", 143), ("SIGINT", 130)])
@pytest.mark.slow
def test_a_signal_in_the_report_step_says_the_run_is_saved(tmp_path, sig, code):
    import os
    import signal
    import subprocess
    import sys
    import time

    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    world = json.dumps({"dataset_kwargs": SMALL_WORLD})
    args = ["evaluate", "--agents", "random", "--n", "3", "--env-kwargs", world]
    args += ["--out", str(tmp_path), "--run-name", "r", "--no-progress"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "250"}
    proc = subprocess.Popen(
        [sys.executable, str(driver), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not (tmp_path / "r" / "reporting").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(getattr(signal, sig))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == code, out + err
    run = tmp_path / "r"
    assert f"interrupted ({sig}) while writing the report: the run is complete" in err
    assert f"its 3 episodes and leaderboard are saved in {run}" in err
    assert f"write the report with: rag-gym view {run}" in err and "Traceback" not in err
    assert len(load_episodes(run / "episodes.jsonl")) == 3 and (run / "leaderboard.md").is_file()

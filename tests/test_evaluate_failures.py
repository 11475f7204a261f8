"""What the evaluator does when something outside the agent fails: a backend that cannot be
reached stops the run (resumable), episodes failed for such a reason are replayed by a resume,
text that is not Unicode fails its episode and nothing else, a damaged protocol and a SIGTERM
during the final write are handled, and the command line exits non-zero when an agent failed
every episode."""

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
from tests.conftest import SMALL_WORLD, EchoLM

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
    """A ValueError (a reply without a usable choice, say) is the agent's: not replayed."""

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
        ('{"k": ' + "7" * 5000 + "}", "expected --env-kwargs to hold numbers of at most 4,300"),
        ('{"k": ' + "[" * 50_000 + "]" * 50_000 + "}", "expected --env-kwargs to be JSON nested"),
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
        dict_option("--env-kwargs", text)


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

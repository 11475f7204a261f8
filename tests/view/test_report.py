"""``rag-gym view``: what the report embeds, damaged and old run folders, errors."""

from __future__ import annotations

import json
import re
import shutil

import pytest
from typer.testing import CliRunner

from rag_gym.cli import app
from rag_gym.view import NotARunFolder, build_report, load_run
from tests.view.conftest import AGENTS, N, write_training_run

pytest.importorskip("jinja2", reason="rag-gym view needs Jinja2: pip install 'rag-gym[view]'")


def embedded(html: str) -> dict:
    m = re.search(r'<script id="run-data" type="application/json">(.*?)</script>', html, re.S)
    assert m, "no embedded run data"
    return json.loads(m.group(1))


def test_report_is_self_contained_and_holds_every_episode(eval_run, tmp_path):
    out = build_report(eval_run, tmp_path / "r.html")
    html = out.read_text()
    data = embedded(html)
    assert len(data["episodes"]) == N * len(AGENTS)
    assert all(e["trace"] for e in data["episodes"])  # every episode has its steps
    assert [r["agent"] for r in data["leaderboard"]["rows"]] == list(AGENTS)
    # nothing is fetched: no external script, style, image or link
    assert not re.search(r'(src|href)\s*=\s*"(https?:)?//', html)
    assert "<link" not in html and html.count("data:image/png;base64,") == 2
    # the passages the steps refer to are embedded once
    ids = {r["id"] for e in data["episodes"] for s in e["trace"] for r in s["retrieved"]}
    assert ids <= set(data["passages"])
    assert data["warnings"] == []


def test_old_run_folder_without_steps_renders_with_a_warning(eval_run, tmp_path):
    old = tmp_path / "old"
    shutil.copytree(eval_run, old)
    (old / "steps.jsonl").unlink()
    (old / "passages.jsonl").unlink()
    data = load_run(old)
    assert len(data["episodes"]) == N * len(AGENTS)
    assert not any("trace" in e for e in data["episodes"])
    assert any(w.startswith(f"{old / 'steps.jsonl'}: missing") for w in data["warnings"])
    html = build_report(old).read_text()
    assert "steps.jsonl: missing" in html and 'class="warning"' in html


def test_a_cut_last_line_renders_with_a_warning_naming_file_and_line(eval_run, tmp_path):
    cut = tmp_path / "cut"
    shutil.copytree(eval_run, cut)
    path = cut / "episodes.jsonl"
    text = path.read_text()
    path.write_text(text[: len(text) - 40])  # a kill in the middle of the last line
    data = load_run(cut)
    assert len(data["episodes"]) == N * len(AGENTS) - 1
    line = N * len(AGENTS)
    assert any(w.startswith(f"{path}:{line}: skipped") for w in data["warnings"])
    html = build_report(cut).read_text()
    assert f"episodes.jsonl:{line}: skipped" in html


def test_a_folder_that_is_not_a_run_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(NotARunFolder, match=r"holds none of protocol.json, episodes.jsonl"):
        build_report(tmp_path)
    with pytest.raises(NotARunFolder, match="which is not a folder"):
        build_report(tmp_path / "notes.txt")
    result = CliRunner().invoke(app, ["view", str(tmp_path)])
    assert result.exit_code == 2
    assert "error: expected a run folder" in result.output


def test_view_command_writes_the_report(eval_run, tmp_path):
    out = tmp_path / "report.html"
    result = CliRunner().invoke(app, ["view", str(eval_run), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert f"report: {out}" in result.output and out.stat().st_size > 10_000


def test_training_run_shows_curve_and_rollouts_by_step(tmp_path):
    run = write_training_run(tmp_path / "train")
    data = load_run(run)
    assert data["train"]["curves"]["loss"] == [[1, 1.0], [2, 0.5], [3, 1 / 3]]
    steps = [r["train_step"] for r in data["train"]["rollouts"]]
    assert steps == [1, 1, 2, 2]
    assert all(r["schema_version"] == 1 and r["steps"] for r in data["train"]["rollouts"])
    assert data["passages"] == {"g1": ["Company", "Ada founded it."]}
    html = build_report(run).read_text()
    assert html.count("data:image/png;base64,") >= 2  # loss and reward curves


def test_damaged_trace_lines_are_named_and_skipped(eval_run, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(eval_run, bad)
    with open(bad / "steps.jsonl", "a") as f:
        f.write('{"schema_version": 99, "agent": "x", "question_id": "y", "steps": []}\n')
        f.write('["not a trace"]\n')
    data = load_run(bad)
    n = N * len(AGENTS)
    assert any(f"steps.jsonl:{n + 1}: schema_version 99" in w for w in data["warnings"])
    assert any(f"steps.jsonl:{n + 2}: not a step trace" in w for w in data["warnings"])


def test_serve_binds_loopback_only_and_serves_the_report(eval_run, tmp_path):
    import threading
    import urllib.request

    from rag_gym.view import make_server

    report = build_report(eval_run, tmp_path / "report.html")
    with make_server(report, 0) as server:
        host, port = server.server_address[:2]
        assert host == "127.0.0.1"
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/report.html", timeout=10) as r:
                assert r.status == 200 and r.read() == report.read_bytes()
        finally:
            server.shutdown()
    with pytest.raises(FileNotFoundError, match="expected a report file"):
        make_server(tmp_path / "missing.html", 0)


def test_an_unwritable_target_names_the_fix(eval_run, tmp_path):
    with pytest.raises(OSError, match=r"cannot write the report to .*: pass another file"):
        build_report(eval_run, tmp_path / "no" / "such" / "dir" / "report.html")


def test_view_never_writes_over_a_run_file(eval_run, tmp_path):
    from rag_gym.evaluate.run_folder import OutputRefused

    run = tmp_path / "run"
    shutil.copytree(eval_run, run)
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    for name in ("episodes.jsonl", "protocol.json", "timing.json", "leaderboard.md"):
        with pytest.raises(OutputRefused, match=f"would replace the run's own {name}"):
            build_report(run, run / name, overwrite=True)
        res = CliRunner().invoke(app, ["view", str(run), "--out", str(run / name), "--overwrite"])
        assert res.exit_code == 2 and f"the run's own {name}" in res.output
        assert not isinstance(res.exception, OutputRefused)
    (run / "leaderboard.csv").unlink()  # a record not written yet is the run's too
    with pytest.raises(OutputRefused, match=r"leaderboard\.csv"):
        build_report(run, run / "leaderboard.csv")
    link = tmp_path / "link.html"
    link.symlink_to(run / "episodes.jsonl")
    with pytest.raises(OutputRefused, match=r"episodes\.jsonl"):
        build_report(run, link, overwrite=True)
    assert all((run / n).read_bytes() == b for n, b in before.items() if n != "leaderboard.csv")
    # an existing file elsewhere needs --overwrite; a report of the run's is rebuilt in place
    mine = tmp_path / "mine.html"
    mine.write_text("my notes")
    with pytest.raises(OutputRefused, match="already exists: pass --overwrite"):
        build_report(run, mine)
    assert mine.read_text() == "my notes"
    assert build_report(run, mine, overwrite=True) == mine and "rag-gym report" in mine.read_text()
    second = build_report(run, run / "second.html")
    assert build_report(run, second, overwrite=True) == second
    assert build_report(run) == run / "report.html" == build_report(run, run / "report.html")
    assert not [p for p in run.iterdir() if p.name.endswith(".tmp")]


def test_nothing_in_a_run_folder_makes_reading_fail(eval_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(eval_run, run)
    hostile = [
        "[" * 100_000 + "]" * 100_000,
        '{"agent": "x", "question_id": "q", "em": ' + "7" * 5_000 + "}",
        '{"agent": "x", "question_id": "\\ud800"}',
        '{"agent": "x", "question_id": "q", "gold_ids": 5, "prompt_tokens": "many"}',
    ]
    lines = {}
    for name in ("episodes.jsonl", "steps.jsonl", "passages.jsonl"):
        lines[name] = len((run / name).read_text().splitlines())
        with open(run / name, "a") as f:
            f.write("\n".join(hostile) + "\n")
    (run / "checkpoint-abc").mkdir()
    (run / "checkpoint-abc" / "trainer_state.json").write_text("{}")
    (run / "timing.json").write_text('{"naive_rag": "\\ud800"}')
    out = build_report(run, tmp_path / "r.html")
    data = embedded(out.read_text(encoding="utf-8"))
    warnings = "\n".join(data["warnings"])
    for name, n in lines.items():
        assert f"{name}:{n + 1}: skipped a line that is not JSON: nested deeper" in warnings
        assert f"{name}:{n + 2}: skipped" in warnings and "5000 digits" in warnings
        assert f"{name}:{n + 3}: skipped" in warnings and "lone surrogate" in warnings
    assert "timing.json: not readable as JSON" in warnings
    assert len(data["episodes"]) == N * len(AGENTS) + 1  # the record with odd field types shows
    assert data["episodes"][-1]["gold_ids"] is None and data["episodes"][-1]["tokens"] == 0
    (run / "protocol.json").write_text("[" * 100_000)
    assert "protocol.json: not readable as JSON" in "\n".join(load_run(run)["warnings"])


def test_only_numbered_checkpoints_hold_training_state(tmp_path):
    run = tmp_path / "train"
    for name, loss in (("checkpoint-abc", 9.0), ("checkpoint-", 8.0), ("checkpoint-20", 1.0)):
        (run / name).mkdir(parents=True)
        state = {"log_history": [{"loss": loss, "step": 1}, {"loss": loss, "step": 2}]}
        (run / name / "trainer_state.json").write_text(json.dumps(state))
    assert load_run(run)["train"]["curves"]["loss"] == [[1, 1.0], [2, 1.0]]


def test_serve_answers_the_report_only_and_to_local_hosts_only(eval_run, tmp_path):
    import http.client
    import threading

    from rag_gym.view import make_server

    report = build_report(eval_run, tmp_path / "report.html")
    (tmp_path / "secret.txt").write_text("not for the web")
    with make_server(report, 0) as server:
        port = server.server_address[1]
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()

        def get(path: str, host: str | None) -> tuple[int, bytes]:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.putrequest("GET", path, skip_host=True)
            if host is not None:
                conn.putheader("Host", host)
            conn.endheaders()
            reply = conn.getresponse()
            status, body = reply.status, reply.read()
            conn.close()
            return status, body

        try:
            page = report.read_bytes()
            for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"LOCALHOST:{port}"):
                assert get("/report.html", host) == (200, page)
                assert get("/", host) == (200, page)
            for path in ("/secret.txt", "/./secret.txt", "/../", "/%2e%2e/", "//secret.txt", "/x/"):
                status, body = get(path, f"127.0.0.1:{port}")
                assert status == 404 and b"not for the web" not in body, path
            assert get("/", f"127.0.0.1:{port}")[1] == page  # no folder listing
            for host in ("evil.example", f"evil.example:{port}", "127.0.0.1:1", "", None):
                status, body = get("/report.html", host)
                assert status == 403 and b"rag-gym report" not in body, host
        finally:
            server.shutdown()

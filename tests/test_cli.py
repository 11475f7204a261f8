"""The rag-gym command line."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rag_gym.cli import app
from tests.conftest import requires_llama

runner = CliRunner()


def test_envs_lists_every_id():
    result = runner.invoke(app, ["envs"])
    assert result.exit_code == 0
    for name in (
        "SynthHop-v0",
        "SynthHop-Hard-v0",
        "HotpotQA-v0",
        "2WikiMultiHopQA-v0",
        "MuSiQue-v0",
        "Bamboogle-v0",
    ):
        assert f"rag_gym/{name}" in result.output


def test_synth_writes_a_world(tmp_path):
    result = runner.invoke(
        app,
        [
            "synth",
            "--out",
            str(tmp_path / "w"),
            "--passages",
            "2000",
            "--seed",
            "3",
            "--questions",
            "100,20,20",
        ],
    )
    assert result.exit_code == 0, result.output
    config = json.loads((tmp_path / "w" / "config.json").read_text())
    assert config["config"]["seed"] == 3 and config["n_passages"] == 2000
    lines = (tmp_path / "w" / "corpus.jsonl").read_text().splitlines()
    assert len(lines) == 2000 and set(json.loads(lines[0])) == {"id", "title", "text"}
    first_q = json.loads((tmp_path / "w" / "validation.jsonl").read_text().splitlines()[0])
    assert first_q["supporting_ids"] and first_q["meta"]["decomposition"]


def test_agents_lists_every_agent_and_the_shipped_checkpoints():
    from rag_gym.agents.search_r1 import SHIPPED
    from rag_gym.baselines import AGENTS

    result = runner.invoke(app, ["agents"])
    assert result.exit_code == 0, result.output
    rows = [line.strip("│ ").split() for line in result.output.splitlines() if "│" in line]
    assert {row[0] for row in rows} >= set(AGENTS)
    # each shipped checkpoint, by the spec that plays it, whole on its line, with its base
    for name in SHIPPED:
        line = next(x for x in result.output.splitlines() if f"search_r1:{name} " in x)
        assert "SmolLM2-135M (embedded)" in line
    assert "trained on" in " ".join(result.output.lower().split()) and "search_r1:RUN_DIR" in (
        result.output
    )


def test_evaluate_random_writes_a_leaderboard_that_matches_its_episodes(tmp_path):
    import csv

    result = runner.invoke(
        app,
        [
            "evaluate",
            "--agents",
            "random",
            "--n",
            "8",
            "--out",
            str(tmp_path),
            "--run-name",
            "r",
            "--no-progress",
        ],
    )
    assert result.exit_code == 0, result.output
    run = tmp_path / "r"
    episodes = [json.loads(line) for line in (run / "episodes.jsonl").read_text().splitlines()]
    # one episode per sampled question, all by the one agent asked for
    assert len(episodes) == 8 and {e["agent"] for e in episodes} == {"random"}
    protocol = json.loads((run / "protocol.json").read_text())
    assert protocol["n"] == 8 and list(protocol["agents"]) == ["random"]
    assert sorted(protocol["question_ids"]) == sorted(e["question_id"] for e in episodes)
    # the leaderboard's numbers are the episodes' means
    with open(run / "leaderboard.csv", newline="") as f:
        (row,) = list(csv.DictReader(f))
    assert row["agent"] == "random" and int(row["episodes"]) == 8

    def mean(key, rows=episodes):
        return sum(float(e[key]) for e in rows) / len(rows)

    for key in ("em", "f1", "searches", "steps"):
        assert float(row[key]) == pytest.approx(mean(key)), key
    answerable = [e for e in episodes if e["answerable"]]
    assert float(row["refusal_answerable"]) == pytest.approx(mean("refused", answerable))
    assert mean("steps") > 0  # the random agent really acted
    # the same row is printed and written as markdown
    table = (run / "leaderboard.md").read_text()
    line = next(x for x in table.splitlines() if x.startswith("| random"))
    assert f"{mean('steps'):.2f}" in line and f"{mean('em'):.3f}" in line
    # the printed table: the agent, its EM with the interval, its searches, and the files
    printed = next(x for x in result.output.splitlines() if x.startswith("random "))
    assert f"{mean('em'):.3f} ({row['em_ci']})" in printed
    assert f"{mean('searches'):.2f}" in printed and "results: " in result.output
    for name in ("em_f1.png", "accuracy_vs_retrievals.png", "timing.json"):
        assert (run / name).stat().st_size > 0, name
    # the report is built at the end and its path printed
    assert f"report: {run / 'report.html'}" in result.output
    assert (run / "report.html").stat().st_size > 10_000


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--agents", "naive_ragg"], "did you mean 'naive_rag'"),
        (["--env", "rag_gym/SynthHop-v1"], "did you mean 'rag_gym/SynthHop-v0'"),
        (["--n", "0"], "expected n >= 1"),
        (["--env", "rag_gym/MuSiQue-v0", "--agents", "random"], "pass path="),
    ],
)
def test_evaluate_errors_are_clear(tmp_path, args, message):
    result = runner.invoke(app, ["evaluate", "--out", str(tmp_path), *args])
    assert result.exit_code == 2
    assert message in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--preset", "hardd"], "did you mean 'hard'"),
        (["--passages", "2000"], "raise n_passages or lower n_questions"),
        (["--questions", "1,2"], "expected n_questions as (train, validation, test) counts"),
        (["--questions", "a,b,c"], "expected --questions as three integers"),
    ],
)
def test_synth_errors(tmp_path, args, message):
    result = runner.invoke(app, ["synth", "--out", str(tmp_path), *args])
    assert result.exit_code == 2 and message in result.output


@pytest.mark.llm
@requires_llama
@pytest.mark.slow
def test_default_evaluate_with_embedded_model(tmp_path):
    result = runner.invoke(
        app, ["evaluate", "--n", "3", "--out", str(tmp_path), "--run-name", "d", "--no-progress"]
    )
    assert result.exit_code == 0, result.output
    rows = (tmp_path / "d" / "leaderboard.csv").read_text().splitlines()
    assert rows[0].startswith("agent,em,em_ci,f1") and {r.split(",")[0] for r in rows[1:]} == {
        "naive_rag",
        "random",
        "search_r1:synthhop",
    }
    protocol = json.loads((tmp_path / "d" / "protocol.json").read_text())
    assert protocol["lm"]["model"] == "SmolLM2-135M-Instruct.Q4_1.gguf"
    trained = protocol["agents"]["search_r1:synthhop"]["lm"]
    adapter = Path(trained["adapter"])  # converted into the cache on first use
    assert adapter.name == "adapter.gguf" and adapter.parent.name.startswith("synthhop-search-r1-")
    assert "results: " in result.output


def test_evaluate_unknown_backend_did_you_mean(tmp_path):
    result = runner.invoke(app, ["evaluate", "--lm", "lama_cpp", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "did you mean 'llama_cpp'" in result.output
    result = runner.invoke(app, ["evaluate", "--lm", "openai:model", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "expected 'openai:<model>@<base_url>'" in result.output


# -- evaluate: a killed run loses nothing and resumes; run folders are never replaced --

SMALL_ENV = json.dumps({"dataset_kwargs": {"n_passages": 2000, "n_questions": [60, 30, 30]}})

#: runs the real command line in a process of its own; each random-agent step sleeps DELAY
#: seconds, so that a signal lands mid-run (results do not depend on it).
DRIVER = """
import os, sys, time
from rag_gym.baselines.random import RandomAgent
delay, act = float(os.environ.get("DELAY", "0")), RandomAgent.act_batch
def slow(self, *args):
    time.sleep(delay)
    return act(self, *args)
RandomAgent.act_batch = slow
from rag_gym.cli import main
sys.argv = ["rag-gym", *sys.argv[1:]]
main()
"""


def rag_gym_process(tmp_path, args, delay=0.0, lines=None, sig=None, timeout=300):
    """Run ``rag-gym ARGS`` in a subprocess; with ``sig``, send it once the run folder's
    episodes.jsonl has ``lines`` lines. Returns (exit code, stderr)."""
    import os
    import subprocess
    import sys
    import time

    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    env = {**os.environ, "DELAY": str(delay), "OMP_NUM_THREADS": "1", "COLUMNS": "250"}
    proc = subprocess.Popen(
        [sys.executable, str(driver), *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    if sig is not None:
        episodes = tmp_path / "runs" / "r" / "episodes.jsonl"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and proc.poll() is None:
            if episodes.is_file() and len(episodes.read_bytes().splitlines()) >= lines:
                proc.send_signal(sig)
                break
            time.sleep(0.005)
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out + err


def leaderboard_without_times(run):
    text = (run / "leaderboard.csv").read_text().splitlines()
    keys = text[0].split(",")
    return [
        {k: v for k, v in zip(keys, row.split(","), strict=True) if k != "seconds"}
        for row in text[1:]
    ]


def episodes_without_times(run):
    lines = (run / "episodes.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(x).items() if k != "seconds"} for x in lines]


@pytest.mark.parametrize(("sig", "code"), [("SIGINT", 130), ("SIGTERM", 143)])
@pytest.mark.slow
def test_evaluate_killed_mid_run_resumes_with_nothing_lost(tmp_path, sig, code):
    import shlex
    import signal

    args = ["evaluate", "--agents", "random", "--n", "30", "--batch-size", "4"]
    args += ["--env-kwargs", SMALL_ENV, "--out", "runs", "--no-progress"]
    rc, output = rag_gym_process(tmp_path, [*args, "--run-name", "full"])
    assert rc == 0, output
    full = tmp_path / "runs" / "full"

    rc, output = rag_gym_process(
        tmp_path, [*args, "--run-name", "r"], delay=0.2, lines=9, sig=getattr(signal, sig)
    )
    run = tmp_path / "runs" / "r"
    saved = len(episodes_without_times(run))
    assert rc == code, output
    assert 9 <= saved < 30, output  # stopped mid-run, every finished episode kept
    assert f"interrupted ({sig}): {saved} finished episodes are saved in runs/r" in output
    (partial,) = leaderboard_without_times(run)
    assert int(partial["episodes"]) == saved
    resume = output.split("resume with: ")[1].splitlines()[0]
    assert resume == "rag-gym evaluate --resume runs/r"

    rc, output = rag_gym_process(tmp_path, shlex.split(resume)[1:])
    assert rc == 0, output
    assert "results: runs/r" in output and "random" in output
    assert episodes_without_times(run) == episodes_without_times(full)
    assert leaderboard_without_times(run) == leaderboard_without_times(full)


@pytest.mark.llm
@pytest.mark.slow
@requires_llama
def test_evaluate_llm_agent_killed_mid_run_resumes_to_the_same_results(tmp_path):
    import signal

    args = ["evaluate", "--agents", "naive_rag", "--n", "2", "--batch-size", "1"]
    args += ["--env-kwargs", SMALL_ENV, "--out", "runs", "--no-progress"]
    rc, output = rag_gym_process(tmp_path, [*args, "--run-name", "full"])
    assert rc == 0, output
    rc, output = rag_gym_process(tmp_path, [*args, "--run-name", "r"], lines=1, sig=signal.SIGTERM)
    run = tmp_path / "runs" / "r"
    assert rc == 143 and len(episodes_without_times(run)) == 1, output
    rc, output = rag_gym_process(tmp_path, ["evaluate", "--resume", "runs/r", "--no-progress"])
    assert rc == 0, output
    full = tmp_path / "runs" / "full"
    assert episodes_without_times(run) == episodes_without_times(full)
    assert leaderboard_without_times(run) == leaderboard_without_times(full)


@pytest.mark.slow
def test_evaluate_run_folders_are_never_replaced_silently(tmp_path):
    base = ["evaluate", "--agents", "random", "--n", "3", "--env-kwargs", SMALL_ENV]
    base += ["--out", str(tmp_path), "--no-progress"]

    def cli(*args):
        return runner.invoke(app, [*base, *args])

    assert cli("--run-name", "r").exit_code == 0
    first = (tmp_path / "r" / "episodes.jsonl").read_text()
    result = cli("--run-name", "r")
    assert result.exit_code == 2 and f"pass --resume {tmp_path / 'r'}" in result.output
    assert (tmp_path / "r" / "episodes.jsonl").read_text() == first
    result = cli("--resume", str(tmp_path / "r"), "--n", "4")
    assert result.exit_code == 2 and "n 4 (the run has 3)" in result.output
    result = cli("--resume", str(tmp_path / "r"))
    assert result.exit_code == 0 and (tmp_path / "r" / "episodes.jsonl").read_text() == first
    assert cli("--run-name", "r", "--overwrite", "--n", "2").exit_code == 0
    assert len((tmp_path / "r" / "episodes.jsonl").read_text().splitlines()) == 2
    # default names: two runs in a row get two folders
    assert cli().exit_code == 0 and cli().exit_code == 0
    assert len([d for d in tmp_path.iterdir() if d.name.startswith("SynthHop-v0__")]) == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--run-name", "ESCAPE"], "expected run_name (--run-name) to name a folder inside"),
        (["--run-name", "/etc/x"], "expected run_name (--run-name) to name a folder inside"),
        (["--out", "FILE"], "expected out_dir (--out) to be a folder"),
        (["--run-name", "notes", "--overwrite"], "is not a rag-gym run folder"),
        (["--resume", "NOTHING"], "protocol.json not found: expected a run folder"),
        (["--resume", "NOTHING", "--run-name", "b"], "to name the --resume folder"),
        (["--resume", "NOTHING", "--overwrite"], "expected resume or overwrite, got both"),
        (["--env-kwargs", "{k: 3}"], "expected env_kwargs to be a dict or a JSON object"),
        (["--env-kwargs", "[1]"], "expected env_kwargs to be a dict or a JSON object"),
    ],
)
def test_evaluate_run_folder_errors_are_clear(tmp_path, args, message):
    (tmp_path / "file").write_text("x")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "notes.txt").write_text("mine")
    escape = f"../../{tmp_path.name}-escaped"  # a name no other run of the suite uses
    args = [str(tmp_path / a.lower()) if a in ("FILE", "NOTHING") else a for a in args]
    args = [escape if a == "ESCAPE" else a for a in args]
    result = runner.invoke(
        app, ["evaluate", "--agents", "random", "--out", str(tmp_path), "--no-progress", *args]
    )
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
    assert (tmp_path / "file").read_text() == "x"
    assert (tmp_path / "notes" / "notes.txt").read_text() == "mine"
    assert not (tmp_path.parent.parent / f"{tmp_path.name}-escaped").exists()
    assert not Path("/etc/x").exists()


def leaderboard_row(agent, em, ci, f1, recall, searches, errors=0, **flags):
    from rag_gym.evaluate.leaderboard import COLUMNS
    from rag_gym.health import FLAGS

    row = {key: float("nan") for key, _, _ in COLUMNS}
    row.update(agent=agent, em=em, em_ci=ci, f1=f1, recall=recall, searches=searches)
    row.update(errors=errors, episodes=100, bad_replies=0, judge_missing=None)
    row.update({f"health_{flag}": flags.get(flag, 0.0) for flag in FLAGS})
    return row


#: the main command's leaderboard (README.md)
MAIN_ROWS = [
    leaderboard_row("naive_rag", 0.0, "0.00–0.00", 0.059, 0.610, 1.00, over_long=0.15),
    leaderboard_row("random", 0.0, "0.00–0.00", 0.013, 0.060, 0.40, answered_unsearched=0.40),
    leaderboard_row("search_r1:synthhop", 0.880, "0.81–0.94", 0.885, 0.990, 1.99),
]


def render(rows, width=80):
    from rich.console import Console

    from rag_gym.evaluate.leaderboard import terminal_table

    console = Console(width=width, record=True, file=io.StringIO())
    console.print(terminal_table(rows, "rag_gym/SynthHop-v0 · validation · 100 questions", width))
    return console.export_text()


def test_the_printed_leaderboard_fits_80_columns_with_every_name_and_em_in_full():
    text = render(MAIN_ROWS)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80
    header = next(line for line in lines if line.startswith("agent"))
    assert header.split() == ["agent", "EM", "(95%", "CI)", "F1", "recall", "searches", "health"]
    by_agent = {line.split()[0]: line for line in lines[lines.index(header) + 2 :] if line.strip()}
    # best first, each name whole on its line, with its EM, interval, F1, recall and searches
    assert list(by_agent)[:3] == ["search_r1:synthhop", "naive_rag", "random"]
    assert by_agent["search_r1:synthhop"].split() == [
        "search_r1:synthhop", "0.880", "(0.81–0.94)", "0.885", "0.990", "1.99", "none"
    ]  # fmt: skip
    assert by_agent["naive_rag"].split()[1:] == [
        "0.000", "(0.00–0.00)", "0.059", "0.610", "1.00", "over-long", "0.15"
    ]  # fmt: skip
    assert "answered" in by_agent["random"] and "0.40" in text  # the health text wraps, whole
    assert "leaderboard.md" in text  # the caption says where every column is


def test_the_printed_leaderboard_keeps_long_names_failures_and_missing_figures_whole():
    rows = [
        *MAIN_ROWS,
        leaderboard_row("search_r1:runs/grpo-2026-11-23/final", 0.5, "0.40–0.60", 0.6, 0.9, 2.5),
        leaderboard_row("ircot", float("nan"), None, float("nan"), 0.2, 3.0, errors=100),
    ]
    rows[0]["health_truncated"] = 0.05  # naive_rag: two flags raised
    text = render(rows)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80
    # a name longer than its column folds onto the next lines, whole
    at = next(i for i, line in enumerate(lines) if line.startswith("search_r1:runs"))
    width = len(lines[at].split()[0])
    folded = [lines[at][:width]]
    folded += [x[:width] for x in lines[at + 1 :] if x[:width].strip() and not x[width:].strip()]
    assert "".join(x.rstrip() for x in folded) == "search_r1:runs/grpo-2026-11-23/final"
    assert "0.500 (0.40–0.60)" in text
    # an agent whose every episode failed: no figure invented, the failures named
    ircot = next(line for line in lines if line.startswith("ircot"))
    assert ircot.split()[:4] == ["ircot", "-", "-", "0.200"] and "100 failed" in ircot
    assert "over-long 0.15 +1" in " ".join(text.split())
    # wider consoles get the same columns, each cell on one line
    wide = render(rows, width=160).splitlines()
    assert any(line.startswith("search_r1:runs/grpo-2026-11-23/final ") for line in wide)


def test_train_export_converts_for_the_runs_recorded_base(tmp_path):
    """``train export RUN`` converts for the base the run recorded (a Qwen2 folder here: its
    Q/K rows unpermuted), ``--base`` names another, and without either the error names
    ``--base``."""
    import gguf

    from tests.generation.test_adapters import fake_adapter

    qwen = tmp_path / "qwen"
    qwen.mkdir()
    heads = {"num_attention_heads": 9, "num_key_value_heads": 3, "num_hidden_layers": 30}
    (qwen / "config.json").write_text(json.dumps({"model_type": "qwen2", **heads}))
    run = tmp_path / "run"
    fake_adapter(run / "final")
    (run / "config.json").write_text(
        json.dumps({"env_id": "rag_gym/SynthHop-v0", "model": str(qwen)})
    )
    done = runner.invoke(app, ["train", "export", str(run), "--out", str(tmp_path / "q.gguf")])
    assert done.exit_code == 0, done.output
    arch = gguf.GGUFReader(str(tmp_path / "q.gguf")).fields["general.architecture"]
    assert bytes(arch.parts[-1]).decode() == "qwen2"
    (qwen / "config.json").write_text(json.dumps({"model_type": "llama", **heads}))
    named = ["train", "export", str(run), "--base", str(qwen), "--out", str(tmp_path / "l.gguf")]
    assert runner.invoke(app, named).exit_code == 0
    arch = gguf.GGUFReader(str(tmp_path / "l.gguf")).fields["general.architecture"]
    assert bytes(arch.parts[-1]).decode() == "llama"
    bare = tmp_path / "bare"
    fake_adapter(bare)
    refused = runner.invoke(app, ["train", "export", str(bare)])
    assert refused.exit_code == 2 and "--base FILE.gguf" in refused.output

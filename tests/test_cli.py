"""The rag-gym command line."""

from __future__ import annotations

import json

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


def test_evaluate_random_prints_leaderboard(tmp_path):
    result = runner.invoke(
        app,
        [
            "evaluate",
            "--agents",
            "random",
            "--n",
            "5",
            "--out",
            str(tmp_path),
            "--run-name",
            "r",
            "--no-progress",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "random" in result.output and "EM" in result.output
    assert (tmp_path / "r" / "leaderboard.md").is_file()


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
def test_default_evaluate_with_embedded_model(tmp_path):
    result = runner.invoke(
        app, ["evaluate", "--n", "3", "--out", str(tmp_path), "--run-name", "d", "--no-progress"]
    )
    assert result.exit_code == 0, result.output
    rows = (tmp_path / "d" / "leaderboard.csv").read_text().splitlines()
    assert rows[0].startswith("agent,em,f1") and {r.split(",")[0] for r in rows[1:]} == {
        "naive_rag",
        "random",
    }
    protocol = json.loads((tmp_path / "d" / "protocol.json").read_text())
    assert protocol["lm"]["model"] == "SmolLM2-135M-Instruct.Q4_1.gguf"


def test_evaluate_unknown_backend_did_you_mean(tmp_path):
    result = runner.invoke(app, ["evaluate", "--lm", "lama_cpp", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "did you mean 'llama_cpp'" in result.output
    result = runner.invoke(app, ["evaluate", "--lm", "openai:model", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "expected 'openai:<model>@<base_url>'" in result.output

"""`rag-gym train pipeline`: SFT, then GRPO/DAPO from it, one run folder with every stage's
figures and wall times; bad options are clear errors before anything trains."""

from __future__ import annotations

import importlib.util
import json

import pytest
from typer.testing import CliRunner

from rag_gym.cli import app
from rag_gym.train.pipeline import PipelineConfig
from tests.conftest import SMALL_WORLD


def run_cli(*args: str):
    return CliRunner().invoke(app, ["train", "pipeline", *args])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--algorithm", "ppo"], "expected algorithm to be 'grpo' or 'dapo', got 'ppo'"),
        (["--steps", "-1"], "grpo_steps"),
        (["--num-generations", "1"], "num_generations"),
        (["--lr", "0"], "expected grpo_learning_rate > 0"),
        (["--env-kwargs", "[1]"], "expected --env-kwargs to be a JSON object"),
    ],
)
def test_bad_options_are_clear_errors(tmp_path, args, message):
    result = run_cli(*args, "--out", str(tmp_path), "--run-name", "bad")
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
    assert not (tmp_path / "bad" / "sft").exists()  # nothing trained


def test_pipeline_config_checks():
    with pytest.raises(ValueError, match="'grpo' or 'dapo'"):
        PipelineConfig(algorithm="ppo")
    with pytest.raises(ValueError, match="step_cost >= 0"):
        PipelineConfig(step_cost=-0.1)
    with pytest.raises(ValueError, match="test_n"):
        PipelineConfig(test_n=-1)


@pytest.mark.slow
@pytest.mark.skipif(
    not all(importlib.util.find_spec(m) for m in ("torch", "transformers", "trl", "peft")),
    reason="training needs torch, transformers, trl and peft: "
    "pip install torch==2.13.0 'rag-gym[train,hf]'",
)
def test_pipeline_runs_sft_then_rl_on_the_tiny_model(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    result = run_cli(
        "--model",
        "tiny",
        "--env-kwargs",
        json.dumps({"dataset_kwargs": SMALL_WORLD}),
        "--demos",
        "8",
        "--steps",
        "1",
        "--num-generations",
        "2",
        "--eval-n",
        "2",
        "--test-n",
        "0",
        "--out",
        str(tmp_path),
        "--run-name",
        "pipe",
    )
    assert result.exit_code == 0, result.output
    root = tmp_path / "pipe"
    report = json.loads((root / "results.json").read_text())
    assert report["command"].startswith("rag-gym ")  # the command line, for the model card
    defaults = PipelineConfig()
    assert report["pipeline"]["algorithm"] == defaults.algorithm
    assert report["pipeline"]["grpo_steps"] == 1
    assert report["stages"]["sft"]["data"]["demonstrations"] == 8
    assert report["stages"]["grpo"]["after"]["n"] == 2
    assert set(report["seconds"]) == {"sft", "grpo", "total"}  # the tiny model is not shipped
    # each figure is rounded to 0.1 s on its own, so the sum may pass the total by 0.1 s
    stages = report["seconds"]["sft"] + report["seconds"]["grpo"]
    assert report["seconds"]["total"] >= stages - 0.1 - 1e-9
    grpo = json.loads((root / "grpo" / "config.json").read_text())
    # the RL stage runs with the pipeline's settings
    assert grpo["algorithm"] == defaults.algorithm
    assert grpo["learning_rate"] == defaults.grpo_learning_rate
    assert grpo["prompts_per_step"] == defaults.prompts_per_step
    assert (root / "grpo" / "final" / "adapter_model.safetensors").is_file()
    assert "wall time" in result.output

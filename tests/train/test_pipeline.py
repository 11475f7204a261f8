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

needs_training = pytest.mark.skipif(
    not all(importlib.util.find_spec(m) for m in ("torch", "transformers", "trl", "peft")),
    reason="training needs torch, transformers, trl and peft: "
    "pip install torch==2.13.0 'rag-gym[train,hf]'",
)


def run_cli(*args: str):
    return CliRunner().invoke(app, ["train", "pipeline", *args])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--algorithm", "ppo"], "expected algorithm to be 'grpo' or 'dapo', got 'ppo'"),
        (["--steps", "-1"], "grpo_steps"),
        (["--num-generations", "1"], "num_generations"),
        (["--lr", "0"], "expected grpo_learning_rate > 0"),
        (["--env-kwargs", "[1]"], "expected env_kwargs to be a dict or a JSON object"),
        (
            ["--env", "rag_gym/HotpotQA-v0,rag_gym/MuSiQue-v0", "--data-path", "h.json"],
            "one data_path per env id",
        ),
        (["--synthhop-ratio", "0.5"], "synthhop_ratio with a real-data env id"),
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
@needs_training
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


@pytest.mark.slow
@needs_training
def test_pipeline_on_real_data_mixed_with_synthhop(tmp_path, monkeypatch):
    """SFT on a HotpotQA-format file's train share (split by id) plus SynthHop transcripts, then
    GRPO on that file's train share, F1 as the answer reward: the runs record every split."""
    from rag_gym.data.splits import id_split
    from tests.agents.test_real_expert import HOTPOT

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    records = [
        {**HOTPOT[i % 2], "_id": f"h{i}", "question": HOTPOT[i % 2]["question"] + f" ({i})"}
        for i in range(24)
    ]
    data = tmp_path / "h.json"
    data.write_text(json.dumps(records))
    train_ids = {r["_id"] for r in records if id_split(r["_id"]) == "train"}
    result = run_cli(
        *("--model", "tiny", "--env", "rag_gym/HotpotQA-v0", "--data-path", str(data)),
        *("--split-by-id", "--synthhop-ratio", "0.25", "--demos", "0"),
        *("--env-kwargs", json.dumps({"answer_metric": "f1"})),
        *("--steps", "1", "--num-generations", "2", "--test-n", "0"),
        *("--out", str(tmp_path), "--run-name", "pipe"),
    )
    assert result.exit_code == 0, result.output
    root = tmp_path / "pipe"
    report = json.loads((root / "results.json").read_text())
    data_stats = report["stages"]["sft"]["data"]
    rows = data_stats["expert"]
    assert {row["type"] for row in rows} == {"bridge", "comparison"}
    kept = sum(row["kept"] for row in rows)
    assert kept and kept + sum(row["dropped"] for row in rows) == len(train_ids)
    # one SynthHop transcript per three real ones
    made = data_stats["demonstrations"] + data_stats["dropped_too_long"]
    assert made == kept + round(kept / 3)
    sft_sets = json.loads((root / "sft" / "config.json").read_text())["training_sets"]
    assert [s["env_id"] for s in sft_sets] == ["rag_gym/HotpotQA-v0", "rag_gym/SynthHop-v0"]
    grpo = json.loads((root / "grpo" / "config.json").read_text())
    assert grpo["env_id"] == "rag_gym/HotpotQA-v0"
    assert grpo["env_kwargs"]["dataset_kwargs"] == {"split_by_id": True}
    assert grpo["env_kwargs"]["answer_metric"] == "f1"

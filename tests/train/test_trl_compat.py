"""rag_gym.train.trl_compat: the supported TRL range, and the private TRL methods it relies on,
pinned against the installed TRL so that an upgrade fails here first."""

from __future__ import annotations

import importlib.util
import inspect
from collections import defaultdict
from types import SimpleNamespace

import pytest

from rag_gym.train import trl_compat

requires_trl = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("torch", "trl", "peft", "datasets")),
    reason="needs pip install torch==2.13.0 'rag-gym[train]'",
)


def test_a_version_outside_the_range_is_refused_with_the_fix(monkeypatch):
    monkeypatch.delenv(trl_compat.ALLOW_ENV, raising=False)
    trl_compat.check_version("1.16.0")
    trl_compat.check_version("1.16.3")
    for version in ("0.19.0", "0.25.0", "1.17.0", "2.0.0"):
        with pytest.raises(trl_compat.TRLVersionError, match=r"pip install 'trl>=1\.16,<1\.17'"):
            trl_compat.check_version(version)
    monkeypatch.setenv(trl_compat.ALLOW_ENV, "1")
    trl_compat.check_version("1.17.0")  # the user's explicit choice


def test_pyproject_pins_the_supported_range():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert f'"trl{trl_compat.SUPPORTED}"' in text


@requires_trl
def test_installed_trl_is_in_range_and_has_the_private_methods():
    trl = trl_compat.require_trl()
    trl_compat.check_private_api(trl)
    for (cls_name, method), expected in trl_compat.PRIVATE_API.items():
        params = tuple(inspect.signature(getattr(getattr(trl, cls_name), method)).parameters)
        assert params[: len(expected)] == expected, (cls_name, method, params)


def test_a_changed_private_signature_fails_loudly():
    class GRPOTrainer:
        def _compute_loss(self, model, inputs, extra):
            pass

        def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, keep):
            pass

        def _generate(self, prompts):
            pass

        def _generate_and_score_completions(self, inputs):
            pass

    class DPOTrainer:
        def _prepare_dataset(self, dataset, processing_class, args, dataset_name):
            pass

        def _precompute_ref_logps(self, dataset, name, batch_size):
            pass

    fake = SimpleNamespace(GRPOTrainer=GRPOTrainer, DPOTrainer=DPOTrainer, __version__="9.0")
    with pytest.raises(trl_compat.TRLVersionError, match="_get_per_token_logps_and_entropies"):
        trl_compat.check_private_api(fake)
    del DPOTrainer._precompute_ref_logps

    def logps(
        self,
        model,
        input_ids,
        attention_mask,
        logits_to_keep,
        batch_size=None,
        compute_entropy=False,
        compute_aux_loss=False,
    ):
        pass

    GRPOTrainer._get_per_token_logps_and_entropies = logps
    with pytest.raises(trl_compat.TRLVersionError, match=r"DPOTrainer\._precompute_ref_logps"):
        trl_compat.check_private_api(fake)


def _fake_grpo(loss_type: str, beta: float, logps):
    """Enough of a GRPOTrainer for TRL's own ``_compute_loss`` (single process, token level)."""
    import torch

    def gather(x):
        return x

    accelerator = SimpleNamespace(
        gather=gather,
        gather_for_metrics=gather,
        reduce=lambda x, reduction="sum": x,
        num_processes=1,
        sync_gradients=True,
    )
    return SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *a, **k: (logps, torch.zeros_like(logps), None),
        aux_loss_enabled=False,
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        importance_sampling_level="token",
        beta=beta,
        args=SimpleNamespace(use_bias_correction_kl=False, delta=None, steps_per_generation=2),
        loss_type=loss_type,
        epsilon_low=0.2,
        epsilon_high=0.28,
        use_vllm=False,
        vllm_importance_sampling_correction=False,
        model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=2,
        max_completion_length=8,
        accelerator=accelerator,
        _entropy_bonus_enabled=False,
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
    )


@requires_trl
@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
def test_aggregate_is_trls_own_token_aggregation(loss_type):
    """TRL's loss with β·k3 equals TRL's loss with β = 0 plus β·aggregate(k3): the copy of TRL's
    aggregation that the stabilized KL uses is TRL's, on the installed version."""
    import torch
    import trl

    torch.manual_seed(0)
    batch, length = 3, 5
    logps = -torch.rand(batch, length) * 3
    ref = -torch.rand(batch, length) * 3
    completion_mask = torch.ones(batch, length, dtype=torch.long)
    completion_mask[0, 3:] = 0
    env_mask = torch.ones(batch, length, dtype=torch.long)
    env_mask[1, 1:3] = 0
    inputs = {
        "prompt_ids": torch.ones(batch, 2, dtype=torch.long),
        "prompt_mask": torch.ones(batch, 2, dtype=torch.long),
        "completion_ids": torch.ones(batch, length, dtype=torch.long),
        "completion_mask": completion_mask,
        "tool_mask": env_mask,
        "advantages": torch.tensor([1.0, -0.5, 0.25]),
        "old_per_token_logps": logps + 0.05,
        "ref_per_token_logps": ref,
        "num_items_in_batch": torch.tensor(11.0),
    }
    beta = 0.3
    with_kl = trl.GRPOTrainer._compute_loss(_fake_grpo(loss_type, beta, logps), None, inputs)
    plain = _fake_grpo(loss_type, 0.0, logps)
    without = trl.GRPOTrainer._compute_loss(plain, None, inputs)
    k3 = torch.exp(ref - logps) - (ref - logps) - 1
    mask = completion_mask * env_mask
    ours = without + beta * trl_compat.aggregate(plain, k3, mask, inputs)
    assert float(ours) == pytest.approx(float(with_kl), rel=1e-5, abs=1e-7)
    assert float(with_kl) != pytest.approx(float(without))  # the KL term is really there


def test_aggregate_refuses_an_unknown_loss_type():
    trainer = SimpleNamespace(loss_type="luspo")
    with pytest.raises(ValueError, match="expected a loss_type in"):
        trl_compat.aggregate(trainer, None, None, {})


@requires_trl
def test_drop_dpo_state_removes_the_ref_adapter_and_the_fused_head():
    from peft import LoraConfig, get_peft_model
    from trl.trainer.utils import add_fused_lm_head

    from rag_gym.train.models import tiny_policy

    model, _ = tiny_policy()
    add_fused_lm_head(model)
    assert "forward" in vars(model)
    lora = get_peft_model(model, LoraConfig(r=2, target_modules="all-linear"))
    lora.add_adapter("ref", lora.peft_config["default"])
    trl_compat.drop_dpo_state(lora)
    assert list(lora.peft_config) == ["default"] and lora.active_adapter == "default"
    assert "forward" not in vars(lora.get_base_model())


def test_colocated_vllm_names_what_is_missing():
    engine = object()
    trainer = SimpleNamespace(vllm_generation=SimpleNamespace(llm=engine))
    assert trl_compat.colocated_vllm(trainer) is engine
    with pytest.raises(trl_compat.TRLVersionError, match="vllm_mode='colocate'"):
        trl_compat.colocated_vllm(SimpleNamespace())


def test_checkpointing_option_names_the_keyword_the_config_has():
    from dataclasses import dataclass

    @dataclass
    class Old:  # transformers before 5.24
        gradient_checkpointing: bool = True

    @dataclass
    class New(Old):
        activation_checkpointing: bool | None = None

    assert trl_compat.checkpointing_option(Old, False) == {"gradient_checkpointing": False}
    assert trl_compat.checkpointing_option(New, True) == {"activation_checkpointing": True}


@requires_trl
@pytest.mark.parametrize("name", ["GRPOConfig", "SFTConfig", "DPOConfig"])
def test_checkpointing_off_without_a_deprecation_warning(name, tmp_path):
    import warnings

    trl = trl_compat.require_trl()
    config_class = getattr(trl, name)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*checkpointing.*", category=FutureWarning)
        args = config_class(
            output_dir=str(tmp_path),
            use_cpu=True,
            **trl_compat.checkpointing_option(config_class, False),
        )
    assert args.gradient_checkpointing is False  # TRL's own default is True


@requires_trl
def test_the_compact_sft_loss_is_trls_own(tmp_path):
    """``sft_trainer_class``'s loss, gradients and logged entropy and accuracy are TRL's
    ``SFTTrainer``'s on the same batch (prompt tokens unlabelled), while its head projects the
    labelled positions only."""
    import copy

    import torch
    import trl
    import trl.trainer.utils as utils
    from datasets import Dataset

    from rag_gym.train.models import tiny_policy

    torch.manual_seed(0)
    model, tok = tiny_policy()
    rows = [
        {"input_ids": list(range(5, 45)), "completion_mask": [0] * 30 + [1] * 10},
        {"input_ids": list(range(50, 75)), "completion_mask": [0] * 20 + [1] * 5},
    ]
    results = {}
    for name, cls in (("trl", trl.SFTTrainer), ("compact", trl_compat.sft_trainer_class())):
        args = trl.SFTConfig(
            output_dir=str(tmp_path / name),
            per_device_train_batch_size=2,
            completion_only_loss=True,
            max_length=None,
            report_to=[],
            use_cpu=True,
        )
        trainer = cls(
            model=copy.deepcopy(model),
            args=args,
            train_dataset=Dataset.from_list(rows),
            processing_class=tok,
        )
        batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
        original = utils._use_triton
        trainer.model.train()
        loss = trainer.compute_loss(trainer.model, batch)
        loss.backward()
        grads = {
            n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None
        }
        metrics = {k: v[-1] for k, v in trainer._metrics["train"].items() if k != "num_tokens"}
        results[name] = (loss.item(), grads, metrics)
        assert utils._use_triton is original  # restored after the call
    (loss_a, grads_a, metrics_a), (loss_b, grads_b, metrics_b) = results["trl"], results["compact"]
    assert loss_a == pytest.approx(loss_b, rel=1e-6)
    assert grads_a.keys() == grads_b.keys() and grads_a
    for name in grads_a:
        torch.testing.assert_close(grads_a[name], grads_b[name], rtol=1e-5, atol=1e-7)
    assert metrics_a.keys() == metrics_b.keys() >= {"entropy", "mean_token_accuracy"}
    for key in metrics_a:
        assert metrics_a[key] == pytest.approx(metrics_b[key], rel=1e-5)


@requires_trl
def test_the_compact_sft_trainer_projects_only_labelled_positions(monkeypatch):
    """Inside its loss TRL's head runs compact (``_use_triton`` answers yes on the CPU)."""
    import torch
    import trl.trainer.utils as utils

    cls = trl_compat.sft_trainer_class()
    answers = []

    def fake_super_loss(self, *args, **kwargs):
        answers.append(utils._use_triton(torch.device("cpu")))
        return torch.tensor(0.0)

    monkeypatch.setattr(cls.__mro__[1], "compute_loss", fake_super_loss)
    cls.compute_loss(object.__new__(cls), None, {})
    assert answers == [True]
    assert utils._use_triton(torch.device("cpu")) is False


@requires_trl
def test_envgrpoconfig_passes_trls_own_fields_by_name_and_mirrors_no_other():
    """Each of ``TRL_FIELDS`` is still a ``trl.GRPOConfig`` field; every other field that shares
    a name with one of TRL's is one ``build_trainer`` sets on purpose (the run folder, its
    checkpoints and seed, a round's steps, the checkpointing option by transformers' version, the
    resumed checkpoint given to ``train()``). A new field mirroring TRL's fails here until it is
    passed through."""
    import dataclasses

    from rag_gym.train.grpo import TRL_FIELDS, EnvGRPOConfig

    trl = trl_compat.require_trl()
    theirs = {f.name for f in dataclasses.fields(trl.GRPOConfig)}
    ours = {f.name for f in dataclasses.fields(EnvGRPOConfig)}
    assert set(TRL_FIELDS) <= theirs & ours
    set_on_purpose = {
        "output_dir",
        "save_steps",
        "seed",
        "max_steps",
        "gradient_checkpointing",
        "resume_from_checkpoint",
    }
    assert ours & theirs - set(TRL_FIELDS) == set_on_purpose

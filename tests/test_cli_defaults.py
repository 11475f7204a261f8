"""One source for every command's options: an option of ``rag-gym evaluate`` and ``rag-gym train
sft|grpo|pipeline`` that sets a config field has that field's default, and sets that field."""

from __future__ import annotations

import dataclasses
import inspect
import typing

import pytest
from typer.testing import CliRunner

from rag_gym import cli
from rag_gym._options import field_help, plain
from rag_gym.evaluate import EvalConfig
from rag_gym.train.grpo import EnvGRPOConfig, train_from
from rag_gym.train.pipeline import PipelineConfig
from rag_gym.train.sft import SFTConfig

runner = CliRunner()

#: every command whose options are made from config fields
COMMANDS = {
    "evaluate": cli.evaluate,
    "train sft": cli.train_sft,
    "train grpo": cli.train_grpo,
    "train pipeline": cli.train_pipeline,
}


def _typer_option(parameter: inspect.Parameter):
    kind, option = typing.get_args(parameter.annotation)
    return kind, option


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_option_is_its_config_fields_in_default_type_and_help(command):
    """An option made from a field has the field's default (as the command line writes it),
    type (as Typer parses it) and help (the field's docstring as plain text); no option is
    declared by hand beside the fields of its config."""
    function = COMMANDS[command]
    params = inspect.signature(function).parameters
    groups = function.__options__
    assert groups, f"{command} takes no options from a config"
    for options in groups.values():
        hints = typing.get_type_hints(options.cls)
        for field in options.fields():
            parameter = params[options.option(field.name)]
            kind, option = _typer_option(parameter)
            default = _field_default(options.cls, field.name)
            hint = hints[field.name]
            if hint == tuple[str, ...]:
                assert (kind, parameter.default) == (str, ",".join(default)), field.name
            elif isinstance(default, dict) or (str in typing.get_args(hint) and hint != str | None):
                # JSON text the config parses: an empty default is no option given
                assert (kind, parameter.default) == (str | None, default or None), field.name
            else:
                assert parameter.default == default, field.name
                assert kind == hint or set(typing.get_args(kind)) == set(typing.get_args(hint)), (
                    field.name,
                    kind,
                    hint,
                )
            assert option.help == field_help(options.cls, field.name), field.name
            assert "``" not in option.help and ":class:" not in option.help


def test_field_help_is_the_docstring_as_plain_text():
    assert (
        field_help(EvalConfig, "n")
        == "Questions to sample (all of them when the split is smaller)."
    )
    assert plain(":class:`~rag_gym.baselines.papers.EvalRarAgent`") == "EvalRarAgent"
    assert plain(":mod:`rag_gym.data`, ``k``") == "rag_gym.data, k"
    with pytest.raises(TypeError, match="has no docstring"):

        @dataclasses.dataclass
        class Bare:
            x: int = 1

        field_help(Bare, "x")


def _field_default(cls: type, name: str):
    field = {f.name: f for f in dataclasses.fields(cls)}[name]
    return field.default_factory() if field.default is dataclasses.MISSING else field.default


def test_the_grpo_defaults_that_differed_are_one():
    """The eight settings on which ``train grpo`` and ``EnvGRPOConfig`` disagreed."""
    params = inspect.signature(cli.train_grpo).parameters
    cfg = EnvGRPOConfig()  # the options' defaults are the fields' (the test above)
    pairs = {
        "reward_preset": "reward_preset",
        "steps": "max_steps",
        "num_generations": "num_generations",
        "prompts_per_step": "prompts_per_step",
        "lr": "learning_rate",
        "beta": "beta",
        "save_steps": "save_steps",
        "tags": "tags",
    }
    assert {o: params[o].default for o in pairs} == {o: getattr(cfg, f) for o, f in pairs.items()}
    assert (cfg.reward_preset, cfg.max_steps, cfg.num_generations) == ("none", 100, 4)
    assert (cfg.prompts_per_step, cfg.learning_rate, cfg.beta) == (2, 2e-5, 0.0)
    assert (cfg.save_steps, cfg.tags, cfg.text_env().tags_or_default) == (
        10,
        None,
        "search_r1",
    )
    # the options without a field: --eval-n is train_from's, --dynamic-sampling auto the
    # config's own choice
    assert params["eval_n"].default == inspect.signature(train_from).parameters["eval_n"].default
    assert params["dynamic_sampling"].default == "auto" and cli._dynamic_sampling("auto") == {}


def test_the_pipeline_evaluates_no_stage_by_default():
    params = inspect.signature(cli.train_pipeline).parameters
    assert params["eval_n"].default == 0
    # one command line parses both configs (examples/train_synthhop_agent.py): no field twice
    names = [f.name for cls in (SFTConfig, PipelineConfig) for f in dataclasses.fields(cls)]
    assert len(names) == len(set(names))


def test_options_set_their_fields(tmp_path, monkeypatch):
    """What a command line sets reaches the config the command builds."""
    import rag_gym.train.grpo as grpo
    import rag_gym.train.pipeline as pipeline
    import rag_gym.train.sft as sft

    seen = {}

    def fake_train_from(cfg, init=None, eval_n=100):
        seen["grpo"] = (cfg, eval_n)
        return {"before": None, "after": None, "checkpoint": "x"}

    def fake_sft(cfg):
        seen["sft"] = cfg
        return {"before": None, "after": None, "checkpoint": "x"}

    def fake_pipeline(sft_cfg, pipe, root, command):
        seen["pipeline"] = (sft_cfg, pipe)
        return {"checkpoint": None, "seconds": {}}

    monkeypatch.setattr(grpo, "train_from", fake_train_from)
    monkeypatch.setattr(sft, "train", fake_sft)
    monkeypatch.setattr(pipeline, "train_and_ship", fake_pipeline)
    monkeypatch.setattr(pipeline, "write_report", lambda root, report: None)
    out = ["--out", str(tmp_path)]

    result = runner.invoke(
        cli.app,
        [
            *("train", "grpo", "--steps", "7", "--lr", "0.5", "--prompts-per-step", "3"),
            *("--reward-preset", "eval_rar", "--eval-n", "4", "--run-name", "g", *out),
        ],
    )
    assert result.exit_code == 0, result.output
    cfg, eval_n = seen["grpo"]
    assert (cfg.max_steps, cfg.learning_rate, cfg.prompts_per_step, eval_n) == (7, 0.5, 3, 4)
    assert cfg.text_env().tags_or_default == "eval_rar"  # the preset's own tags, as in Python
    assert cfg.num_generations == EnvGRPOConfig().num_generations
    assert cfg.run_dir == str(tmp_path / "g")
    assert cfg.stages == ()

    stages = '[["discovery", 0.5], ["refinement", 1.0]]'  # EVO-RAG's two stages, as JSON
    args = ["train", "grpo", "--reward-preset", "evo_rag", "--stages", stages, *out]
    result = runner.invoke(cli.app, args)
    assert result.exit_code == 0, result.output
    assert seen["grpo"][0].stages == (("discovery", 0.5), ("refinement", 1.0))
    result = runner.invoke(cli.app, ["train", "grpo", "--stages", '["discovery"]', *out])
    assert result.exit_code != 0 and "stages" in result.output

    result = runner.invoke(
        cli.app, ["train", "sft", "--lr", "0.25", "--demos", "0", "--run-name", "s", *out]
    )
    assert result.exit_code == 0, result.output
    assert (seen["sft"].learning_rate, seen["sft"].n_demos) == (0.25, None)
    assert seen["sft"].batch_size == SFTConfig().batch_size

    result = runner.invoke(
        cli.app,
        [
            *("train", "pipeline", "--sft-lr", "0.25", "--lr", "0.5", "--steps", "3"),
            *("--eval-n", "2", "--test-n", "0", "--run-name", "p", *out),
        ],
    )
    assert result.exit_code == 0, result.output
    sft_cfg, pipe = seen["pipeline"]
    assert (sft_cfg.learning_rate, sft_cfg.eval_n, sft_cfg.eval_before) == (0.25, 2, False)
    assert (pipe.grpo_learning_rate, pipe.grpo_steps) == (0.5, 3)
    assert sft_cfg.run_dir == str(tmp_path / "p" / "sft")


def test_evaluate_config_defaults_are_the_main_commands():
    assert EvalConfig().agents == ("naive_rag", "random", "search_r1:synthhop")


def test_train_grpo_data_path_and_split_by_id_go_into_the_env_kwargs(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    from rag_gym.train import grpo

    seen = {}

    def fake_train_from(cfg, init=None, eval_n=0):
        seen["cfg"] = cfg
        return {"before": None, "after": None, "checkpoint": None}

    monkeypatch.setattr(grpo, "train_from", fake_train_from)
    args = ["train", "grpo", "--env", "rag_gym/HotpotQA-v0", "--data-path", "d/hotpotqa"]
    args += ["--split-by-id", "--env-kwargs", '{"answer_metric": "f1"}', "--out", str(tmp_path)]
    out = CliRunner().invoke(cli.app, args)
    assert out.exit_code == 0, out.output
    assert seen["cfg"].env_kwargs == {
        "answer_metric": "f1",
        "data_path": "d/hotpotqa",
        "dataset_kwargs": {"split_by_id": True},
    }

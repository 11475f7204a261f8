"""The command line's names: its docstring lists every command, ``--index`` is the env's
``index=`` (``--retriever`` its deprecated alias)."""

from __future__ import annotations

import json
from typing import ClassVar

import pytest
import typer
from typer.testing import CliRunner

import rag_gym.cli
import rag_gym.commands
from rag_gym.cli import app
from rag_gym.data.synthhop import world_for
from rag_gym.retrieval import BM25Retriever
from tests.conftest import SMALL_WORLD, EchoLM, requires_llama

runner = CliRunner()


def _commands(group, prefix=()) -> list[tuple[str, ...]]:
    out = []
    for name, command in group.commands.items():
        path = (*prefix, name)
        out.append(path)
        if hasattr(command, "commands"):
            out.extend(_commands(command, path))
    return out


def test_module_docstring_names_every_command():
    doc = rag_gym.cli.__doc__
    commands = _commands(typer.main.get_command(app))
    assert {"evaluate", "serve"} <= {c[0] for c in commands}
    # a command is named as ``name``, a group as ``group sub`` or ``group`` (``a``, ``b``)
    named = ("``{}``", "``{} ", " {}``")
    missing = [" ".join(c) for c in commands if not any(f.format(c[-1]) in doc for f in named)]
    assert missing == [], f"cli.py's docstring does not name {missing}"


def _evaluate(tmp_path, name: str, *flags: str, agent: str = "random"):
    return runner.invoke(
        app,
        [
            "evaluate",
            "--agents",
            agent,
            "--n",
            "2",
            "--env-kwargs",
            json.dumps({"dataset_kwargs": SMALL_WORLD}),
            "--out",
            str(tmp_path),
            "--run-name",
            name,
            "--no-progress",
            *flags,
        ],
    )


def test_index_option_and_its_deprecated_alias(tmp_path):
    index = str(BM25Retriever(world_for(**SMALL_WORLD).corpus).save(tmp_path / "idx"))
    new = _evaluate(tmp_path, "new", "--index", index)
    old = _evaluate(tmp_path, "old", "--retriever", index)
    assert new.exit_code == 0 and old.exit_code == 0, (new.output, old.output)
    assert "--retriever is deprecated: use --index" in old.output
    assert "deprecated" not in new.output
    protocols = [json.loads((tmp_path / n / "protocol.json").read_text()) for n in ("new", "old")]
    assert protocols[0]["env_kwargs"]["index"] == protocols[1]["env_kwargs"]["index"] == index
    both = _evaluate(tmp_path, "both", "--index", index, "--retriever", str(tmp_path))
    assert both.exit_code == 2 and "expected one index directory" in both.output


# -- the LM options: --n-ctx, --max-new-tokens, --temperature, --chat-template -----------------


class _TemplatedLM(EchoLM):
    """A stand-in backend that records how :func:`make_lm` built it and describes its chat
    template as the local backends do (the model's own unless one is named)."""

    made: ClassVar[list[dict]] = []

    def __init__(self, spec, **options) -> None:
        from rag_gym.generation.chat_templates import chat_template, own_template

        super().__init__("Velmora")
        self.made.append({"spec": spec, **options})
        self.n_ctx = options.get("n_ctx") or 4096
        self.template = chat_template(options.get("chat_template")) or own_template("{{ x }}")
        self.set_options(options.get("max_new_tokens"), options.get("temperature"))

    def describe(self):
        return {"backend": "fake", "n_ctx": self.n_ctx, "chat_template": self.template.describe()}


def _with_fake_lm(monkeypatch):
    import rag_gym.generation.backends as backends

    _TemplatedLM.made = []
    monkeypatch.setattr(backends, "make_lm", lambda spec, seed=0, **kw: _TemplatedLM(spec, **kw))
    return _TemplatedLM.made


def _naive(tmp_path, name, *flags):
    return _evaluate(tmp_path, name, *flags, agent="naive_rag")


def test_lm_options_reach_the_backend_and_the_protocol(tmp_path, monkeypatch):
    made = _with_fake_lm(monkeypatch)
    flags = ["--n-ctx", "1024", "--max-new-tokens", "7", "--temperature", "0.5"]
    result = _naive(tmp_path, "run", *flags, "--chat-template", "gemma")
    assert result.exit_code == 0, result.output
    options = {"n_ctx": 1024, "max_new_tokens": 7, "temperature": 0.5, "chat_template": "gemma"}
    assert made == [{"spec": "llama_cpp", **options}]
    protocol = json.loads((tmp_path / "run" / "protocol.json").read_text())
    assert {k: protocol["config"][k] for k in options} == options
    assert protocol["lm"]["chat_template"]["name"] == "gemma"
    agent = protocol["agents"]["naive_rag"]
    assert (agent["max_tokens"], agent["temperature"]) == (7, 0.5)
    assert agent["lm"]["chat_template"]["name"] == "gemma"
    # a resume rebuilds the backend with the run's own options
    again = runner.invoke(app, ["evaluate", "--resume", str(tmp_path / "run"), "--no-progress"])
    assert again.exit_code == 0, again.output
    assert made[-1] == {"spec": "llama_cpp", **options}
    # and refuses another template
    other = runner.invoke(
        app,
        ["evaluate", "--resume", str(tmp_path / "run"), "--chat-template", "chatml"],
    )
    assert other.exit_code == 2 and "its protocol differs" in other.output


def test_the_default_options_change_nothing(tmp_path, monkeypatch):
    made = _with_fake_lm(monkeypatch)
    assert _naive(tmp_path, "run").exit_code == 0
    assert made == [{"spec": "llama_cpp", **dict.fromkeys(rag_gym.commands.LM_OPTIONS)}]
    agent = json.loads((tmp_path / "run" / "protocol.json").read_text())["agents"]["naive_rag"]
    assert agent["max_tokens"] == 32 and "temperature" not in agent  # naive_rag's own, greedy


def test_a_run_recorded_before_templates_resumes(tmp_path, monkeypatch):
    _with_fake_lm(monkeypatch)
    assert _naive(tmp_path, "old").exit_code == 0
    path = tmp_path / "old" / "protocol.json"
    protocol = json.loads(path.read_text())  # as rag-gym wrote it before: no template, no options
    del protocol["lm"]["chat_template"], protocol["agents"]["naive_rag"]["lm"]["chat_template"]
    for key in rag_gym.commands.LM_OPTIONS:
        del protocol["config"][key]
    path.write_text(json.dumps(protocol))
    (tmp_path / "old" / "episodes.jsonl").write_text("")  # so the resume plays them again
    result = runner.invoke(app, ["evaluate", "--resume", str(tmp_path / "old"), "--no-progress"])
    assert result.exit_code == 0, result.output
    # but a run without a record did not use a named template
    del protocol["lm"]  # (the agents' records are what a resume compares)
    path.write_text(json.dumps(protocol))
    named = runner.invoke(
        app, ["evaluate", "--resume", str(tmp_path / "old"), "--chat-template", "chatml"]
    )
    assert named.exit_code == 2 and "its protocol differs" in named.output


def test_bad_lm_options_are_refused_before_the_run(tmp_path, monkeypatch):
    _with_fake_lm(monkeypatch)
    bad = _naive(tmp_path, "a", "--chat-template", "chatm")
    assert bad.exit_code == 2 and "did you mean 'chatml'?" in bad.output
    bad = _naive(tmp_path, "b", "--max-new-tokens", "0")
    assert bad.exit_code == 2 and "expected max_new_tokens >= 1, got 0" in bad.output
    bad = _naive(tmp_path, "c", "--temperature", "-1")
    assert bad.exit_code == 2 and "expected temperature >= 0" in bad.output
    suite = runner.invoke(app, ["evaluate", "--suite", "multihop", "--chat-template", "chatm"])
    assert suite.exit_code == 2 and "did you mean 'chatml'?" in suite.output
    assert not (tmp_path / "a").exists()


@requires_llama
@pytest.mark.llm
@pytest.mark.slow
def test_a_gguf_without_a_template_is_refused_unless_named(tmp_path):
    from tests.generation.test_chat_templates import template_less_copy

    bare = template_less_copy(tmp_path / "bare.gguf")
    lm = f"llama_cpp:{bare}"
    refused = _naive(tmp_path, "refused", "--lm", lm)
    assert refused.exit_code == 2
    assert "bare.gguf has no chat template" in refused.output
    assert "--chat-template chatml|gemma|llama3|FILE" in refused.output
    assert not (tmp_path / "refused" / "protocol.json").exists()
    named = _naive(tmp_path, "named", "--lm", lm, "--chat-template", "chatml")
    assert named.exit_code == 0, named.output
    protocol = json.loads((tmp_path / "named" / "protocol.json").read_text())
    assert protocol["lm"]["chat_template"]["name"] == "chatml"
    assert protocol["agents"]["naive_rag"]["lm"]["chat_template"]["from"] == "builtin"


@requires_llama
@pytest.mark.llm
@pytest.mark.slow
def test_a_judge_without_a_template_is_refused_before_the_run(tmp_path):
    from tests.generation.test_chat_templates import template_less_copy

    bare = template_less_copy(tmp_path / "judge.gguf")
    result = _evaluate(tmp_path, "judged", "--judge", f"llama_cpp:{bare}")
    assert result.exit_code == 2 and "judge.gguf has no chat template" in result.output
    assert not (tmp_path / "judged").exists()

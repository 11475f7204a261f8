"""The command line's names: its docstring lists every command, ``--index`` is the env's
``index=`` (``--retriever`` its deprecated alias)."""

from __future__ import annotations

import json

import typer
from typer.testing import CliRunner

import rag_gym.cli
from rag_gym.cli import app
from rag_gym.data.synthhop import world_for
from rag_gym.retrieval import BM25Retriever
from tests.conftest import SMALL_WORLD

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


def _evaluate(tmp_path, name: str, *flags: str):
    return runner.invoke(
        app,
        [
            "evaluate",
            "--agents",
            "random",
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

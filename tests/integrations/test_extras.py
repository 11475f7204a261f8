"""The OpenEnv and verifiers modules import their extra at their top: without it, importing one
(or running ``rag-gym openenv serve``) is an ``ImportError`` naming the extra to install, and the
modules they share with rag-gym alone still import. Runs with or without the extras (their
absence is simulated)."""

from __future__ import annotations

import importlib
import sys

import pytest

GATED = {
    "rag_gym.integrations.openenv_server": "openenv",
    "rag_gym.integrations.openenv_client": "openenv",
    "rag_gym.integrations.verifiers_taskset": "verifiers",
    "rag_gym.integrations.verifiers_tools": "verifiers",
    "rag_gym_verifiers": "verifiers",
}


def _without(monkeypatch, package: str) -> None:
    """Make ``package`` unimportable (as where it is not installed) and forget the modules that
    imported it, for this test only."""
    for name in list(sys.modules):
        if name == package or name.startswith(f"{package}."):
            monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, package, None)
    for name in GATED:
        monkeypatch.delitem(sys.modules, name, raising=False)
        parent, _, child = name.rpartition(".")
        if parent in sys.modules:  # ``from parent import child`` reads the attribute first
            monkeypatch.delattr(sys.modules[parent], child, raising=False)


@pytest.mark.parametrize(("module", "package"), sorted(GATED.items()))
def test_a_missing_extra_is_named(monkeypatch, module, package):
    _without(monkeypatch, package)
    with pytest.raises(ImportError, match=rf"pip install 'rag-gym\[{package}\]'"):
        importlib.import_module(module)


def test_the_shared_modules_need_no_extra(monkeypatch):
    _without(monkeypatch, "openenv")
    _without(monkeypatch, "verifiers")
    from rag_gym.integrations.openenv_config import ServerConfig
    from rag_gym.integrations.trl_env import RagGymToolEnv
    from rag_gym.integrations.verifiers_common import tool_schema

    assert ServerConfig().max_concurrent_envs == 64
    assert tool_schema(RagGymToolEnv.answer)["function"]["parameters"]["required"] == ["answer"]


def test_openenv_serve_without_openenv_names_the_extra(monkeypatch):
    from typer.testing import CliRunner

    from rag_gym.cli import app

    _without(monkeypatch, "openenv")
    result = CliRunner().invoke(app, ["openenv", "serve", "--env", "rag_gym/SynthHop-v0"])
    assert result.exit_code == 2
    assert "pip install 'rag-gym[openenv]'" in result.output

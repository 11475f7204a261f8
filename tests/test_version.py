"""The package reports its version: ``rag_gym.__version__`` and ``rag-gym --version``."""

from pathlib import Path

from typer.testing import CliRunner

import rag_gym
from rag_gym.cli import app


def test_version_option_prints_the_package_version_and_exits():
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"rag-gym {rag_gym.__version__}"


def test_version_is_the_changelog_release():
    changelog = Path(__file__).resolve().parents[1] / "CHANGELOG.md"
    assert f"## [{rag_gym.__version__}]" in changelog.read_text(encoding="utf-8")

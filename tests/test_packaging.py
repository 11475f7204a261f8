"""The wheel, as a user installs it: every file of the package that is not Python code (each one
the code reads) is in it, the shipped adapter once, and a non-editable install runs a shipped
suite and a SynthHop episode of the shipped agent.

The wheel is built from a copy of git's file list (what a clean clone has), with pip (its build
backend comes from PyPI unless this environment has it), and installed without its dependencies
into a fresh virtualenv that finds them in this environment's site-packages."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.conftest import requires_llama

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("git") is None or not (ROOT / ".git").exists(),
        reason="builds the wheel from git's file list: needs a git checkout",
    ),
]


def _tracked() -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60
    ).stdout
    return [name for name in out.decode().split("\0") if name]


def _has_backend() -> bool:
    """Whether this environment can build the wheel without fetching the build backend."""
    try:
        from importlib.metadata import version

        return int(version("setuptools").split(".")[0]) >= 77 and bool(
            importlib.util.find_spec("wheel")
        )
    except Exception:
        return False


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    source = tmp_path_factory.mktemp("source")
    for name in _tracked():
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    out = tmp_path_factory.mktemp("dist")
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out)]
    if _has_backend():
        command.append("--no-build-isolation")
    built = subprocess.run(
        [*command, str(source)], capture_output=True, text=True, timeout=900, check=False
    )
    assert built.returncode == 0, built.stdout + built.stderr
    (found,) = out.glob("rag_gym-*.whl")
    return found


def test_the_wheel_carries_every_package_file_and_the_adapter_once(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    data = [n for n in _tracked() if n.startswith("rag_gym/") and not n.endswith(".py")]
    assert "rag_gym/evaluate/suites/search_r1.json" in data  # what the check is about
    assert [n for n in data if n not in names] == []
    modules = [n for n in _tracked() if n.startswith("rag_gym/") and n.endswith(".py")]
    assert [n for n in modules if n not in names] == []
    adapters = [n for n in names if n.startswith("rag_gym/checkpoints/")]
    assert sum(n.endswith((".safetensors", ".gguf", ".bin")) for n in adapters) == 1
    assert not [n for n in names if n.startswith(("tests/", "docs/", "benchmarks/"))]


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """A fresh virtualenv with the wheel installed (not editable); its dependencies are found in
    this environment's site-packages, listed after its own."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    here = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    Path(site, "outer_site_packages.pth").write_text("\n".join(sorted(here)) + "\n")
    subprocess.run(
        [str(python), "-m", "pip", "install", "--no-deps", "--quiet", str(wheel)],
        check=True,
        timeout=600,
    )
    return venv


def _run(venv: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "RAG_GYM_CACHE": str(cwd / "cache"), "NO_COLOR": "1"}
    env.pop("PYTHONPATH", None)
    return subprocess.run(
        [str(venv / "bin" / "rag-gym"), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )


def test_the_installed_package_is_the_wheel_s(installed, tmp_path):
    where = subprocess.run(
        [str(installed / "bin" / "python"), "-c", "import rag_gym; print(rag_gym.__file__)"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    ).stdout.strip()
    assert Path(where).is_relative_to(installed), where


def test_the_installed_package_runs_a_shipped_suite(installed, tmp_path):
    """``--suite search_r1`` from the wheel: its Bamboogle column on two questions, the suite's
    text pinned in the run as shipped."""
    data = tmp_path / "data" / "bamboogle"
    data.mkdir(parents=True)
    rows = [
        {"id": "b1", "question": "What is Ardent?", "golden_answers": ["a river"]},
        {"id": "b2", "question": "What is Belmor?", "golden_answers": ["a town"]},
    ]
    (data / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    corpus = tmp_path / "corpus.jsonl"
    passages = [("1", '"Ardent"\nArdent is a river.'), ("2", '"Belmor"\nBelmor is a town.')]
    corpus.write_text("".join(json.dumps({"id": i, "contents": c}) + "\n" for i, c in passages))
    result = _run(
        installed,
        "evaluate",
        "--suite",
        "search_r1",
        "--data-root",
        str(tmp_path / "data"),
        "--datasets",
        "Bamboogle",
        "--agents",
        "random",
        "--corpus",
        str(corpus),
        "--out",
        str(tmp_path / "runs"),
        "--run-name",
        "suite",
        "--no-progress",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    pinned = json.loads((tmp_path / "runs" / "suite" / "suite.json").read_text())["suite"]
    shipped = (ROOT / "rag_gym" / "evaluate" / "suites" / "search_r1.json").read_text()
    assert pinned["name"] == "search_r1" and pinned["text"] == shipped
    episodes = (tmp_path / "runs" / "suite" / "Bamboogle" / "episodes.jsonl").read_text()
    assert len(episodes.splitlines()) == 2


@requires_llama
def test_the_installed_package_plays_the_shipped_agent(installed, tmp_path):
    """One SynthHop episode of ``search_r1:synthhop`` on llama.cpp from the wheel: its adapter
    converted into the cache, and a report written from the shipped templates."""
    result = _run(
        installed,
        "evaluate",
        "--agents",
        "search_r1:synthhop",
        "--n",
        "1",
        "--out",
        str(tmp_path / "runs"),
        "--run-name",
        "one",
        "--no-progress",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    run = tmp_path / "runs" / "one"
    (record,) = map(json.loads, (run / "episodes.jsonl").read_text().splitlines())
    assert record["agent"] == "search_r1:synthhop" and record.get("error") is None
    assert "SEARCH" in record["actions"]
    protocol = json.loads((run / "protocol.json").read_text())
    adapter = Path(protocol["agents"]["search_r1:synthhop"]["lm"]["adapter"])
    assert adapter.is_relative_to(tmp_path / "cache") and adapter.is_file()
    style = (ROOT / "rag_gym" / "view" / "templates" / "report.css").read_text().splitlines()[0]
    assert style in (run / "report.html").read_text()

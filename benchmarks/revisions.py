"""This tree against a git revision (``--against REV``): run a benchmark's step with the
``rag_gym`` package of another revision, in a fresh process.

:func:`extract_revision` writes revision ``REV``'s ``rag_gym`` to a folder; :func:`package_env`
is the environment that imports it first; :func:`run_step` runs a script's step in a fresh
process (this tree's, or the package's) and reads back the JSON figures it wrote. The benchmark
script itself stays this tree's, so a step may only use what both revisions have.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def extract_revision(rev: str, into: Path) -> Path:
    """The ``rag_gym`` package of git revision ``rev`` of this repository, written under
    ``into``; a revision git does not know is an error naming it."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", rev, "rag_gym"],
        capture_output=True,
        check=False,
    )
    if archive.returncode != 0:
        raise SystemExit(f"--against {rev}: git cannot read it ({archive.stderr.decode().strip()})")
    into.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def package_env(package: Path | None) -> dict[str, str] | None:
    """The environment of a process that imports the ``rag_gym`` in ``package`` (a folder
    holding it) instead of this tree's; ``None`` (this process's) without one."""
    if package is None:
        return None
    path = os.pathsep.join([str(package), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path}


def run_step(script: str, argv: list[str], package: Path | None = None, name: str = "") -> dict:
    """Run ``python script *argv --result FILE`` in a fresh process (with ``package``'s
    ``rag_gym`` when given) and return the JSON the step wrote to FILE (``{}`` when none); a
    step that fails is printed with its exit status."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        result = Path(f.name)
    cmd = [sys.executable, script, *argv, "--result", str(result)]
    proc = subprocess.run(cmd, check=False, env=package_env(package))
    try:
        out = json.loads(result.read_text() or "{}")
    finally:
        result.unlink(missing_ok=True)
    if proc.returncode != 0:
        print(f"  the {name or argv[0]} step failed (exit {proc.returncode})")
    return out

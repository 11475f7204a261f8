"""Helpers for tests that tamper with saved index folders."""

from __future__ import annotations

import json
from pathlib import Path

from rag_gym.retrieval import persist


def reseal(out: Path) -> None:
    """Recompute the manifest and the params checksum after tampering, as a careful forger
    would: what is left to catch the damage are the checks behind the checksums."""
    params = json.loads((out / "params.json").read_text())
    params["files"] = {name: persist._file_entry(out / name) for name in persist._files(out)}
    params["params_sha256"] = persist._params_digest(params)
    (out / "params.json").write_text(json.dumps(params))


def edit_params(out: Path, **changes) -> None:
    """Edit params.json and reseal it (an edit that keeps the file self-consistent)."""
    params = json.loads((out / "params.json").read_text())
    params.update(changes)
    params["params_sha256"] = persist._params_digest(params)
    (out / "params.json").write_text(json.dumps(params))

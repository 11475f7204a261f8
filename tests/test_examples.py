"""The examples run top to bottom."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_custom_reward_example_runs():
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "custom_reward.py")],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    oracle, lazy = out.split("\nlazy: ")
    assert "answer=+1.00" in oracle and "return +1.800" in oracle
    assert "evaluation=+0.10" in lazy and "return +0.450" in lazy

"""ruff and mypy, as configured in pyproject.toml, find nothing: part of the test command."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def test_ruff_finds_nothing():
    done = subprocess.run([str(BIN / "ruff"), "check", "--output-format", "concise", "."], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-2000:]


def test_mypy_finds_nothing():
    done = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-2000:]

"""The package's layers point one way and no import circle closes anywhere, function-level and TYPE_CHECKING imports
counted: import-linter's two contracts in pyproject.toml (docs/layout.md), checked on the checkout and on copies of
the package with a planted fault each."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).with_name("lint-imports")


def lint(package_parent: Path) -> subprocess.CompletedProcess[str]:
    """`lint-imports` with the project's contracts, on the package found first under ``package_parent``."""
    env = {**os.environ, "PYTHONPATH": str(package_parent)}
    return subprocess.run([str(LINT), str(ROOT / "pyproject.toml"), "--no-cache"], capture_output=True,
                          text=True, timeout=300, env=env, cwd=package_parent)


def test_the_checkout_keeps_both_contracts() -> None:
    done = lint(ROOT / "src")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "Contracts: 2 kept, 0 broken." in done.stdout


def test_the_layers_name_every_module_of_the_package_and_make_no_exception() -> None:
    # exhaustive: a new module or package of pitfalls must be given its layer, or the contract breaks. An
    # exception to the layers would be an ignore_imports line, written with its reason: there is none.
    text = (ROOT / "pyproject.toml").read_text()
    section = text[text.index("[tool.importlinter]"):]
    assert 'containers = ["pitfalls"]' in section and "exhaustive = true" in section
    assert "ignore_imports" not in section


# (the module planted into, the line planted at its end, what the report names)
PLANTED = [
    ("probes/timing.py", "def _upward():\n    import pitfalls.report  # noqa: F401\n",
     "pitfalls.probes is not allowed to import pitfalls.report"),
    ("known/table.py",
     "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pitfalls.probes.syncs import HazardCounts\n",
     "pitfalls.known is not allowed to import pitfalls.probes"),
    ("families/loss.py", "def _upward():\n    from pitfalls.measure import case  # noqa: F401\n",
     "pitfalls.families is not allowed to import pitfalls.measure"),
    # Both in the commands layer, whose siblings may import each other: the acyclic contract catches the circle.
    ("runner/store.py", "def _circle():\n    import pitfalls.gpu_run.run  # noqa: F401\n",
     "- .runner -> .gpu_run (1 import)"),
]


@pytest.mark.parametrize(("module", "planted", "named"), PLANTED, ids=[p[0] for p in PLANTED])
def test_a_planted_upward_import_or_circle_breaks_a_contract(tmp_path: Path, module: str, planted: str,
                                                             named: str) -> None:
    copy = tmp_path / "pitfalls"
    shutil.copytree(ROOT / "src" / "pitfalls", copy, ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / module
    target.write_text(target.read_text() + "\n\n" + planted)
    done = lint(tmp_path)
    assert done.returncode == 1, done.stdout[-4000:]
    assert "BROKEN" in done.stdout and named in done.stdout, done.stdout[-4000:]

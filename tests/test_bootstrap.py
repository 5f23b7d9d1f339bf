"""scripts/bootstrap's stamp: a venv is up to date when this checkout made it with the torch asked for and at least
the extras asked for (the main job's scripts ask for the bench extra, the test command for both), read by
``--check``, which installs nothing."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from sandbox import ROOT, bootstrap_digest

TORCH = "torch==2.13.0"


def check(venv: Path, stamp: str | None, **variables: str) -> subprocess.CompletedProcess[str]:
    """``scripts/bootstrap --check`` of a venv whose stamp reads ``stamp`` (none: no stamp)."""
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    # Not an interpreter: whatever would install into it fails instead of reaching a real Python.
    (venv / "bin" / "python").write_text("#!/bin/sh\necho 'the venv was used' >&2\nexit 97\n")
    (venv / "bin" / "python").chmod(0o755)
    if stamp is not None:
        (venv / ".pitfalls-installed").write_text(stamp + "\n")
    env = {name: value for name, value in os.environ.items() if name not in ("PITFALLS_EXTRAS", "PITFALLS_TORCH")}
    return subprocess.run(["bash", "scripts/bootstrap", "--check"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env={**env, "PITFALLS_VENV": str(venv), **variables}, check=False)


@pytest.mark.parametrize("made, asked", [("test,bench", "bench"), ("test,bench", "test,bench"), ("bench,test", None),
                                         ("bench", "bench")])
def test_a_venv_with_the_extras_asked_for_or_more_is_up_to_date(tmp_path: Path, made: str, asked: str | None):
    extras = {} if asked is None else {"PITFALLS_EXTRAS": asked}
    done = check(tmp_path / "venv", f"{bootstrap_digest()} {TORCH} {made}", **extras)
    assert (done.returncode, done.stderr) == (0, "")


@pytest.mark.parametrize("stamp, asked", [
    ("{digest} {torch} bench", None),  # the main job's venv: the test command adds the test tools
    ("{digest} {torch} bench", "test"),
    ("{digest} {torch}", "bench"),  # a stamp written before the extras were recorded
    ("0123456789abcdef {torch} test,bench", "bench"),  # another pyproject.toml or script
    ("{digest} torch==2.14.1 test,bench", "bench"),
    (None, "bench"),
])
def test_a_venv_without_them_or_made_otherwise_is_not(tmp_path: Path, stamp: str | None, asked: str | None):
    extras = {} if asked is None else {"PITFALLS_EXTRAS": asked}
    written = None if stamp is None else stamp.format(digest=bootstrap_digest(), torch=TORCH)
    done = check(tmp_path / "venv", written, **extras)
    venv = tmp_path / "venv"
    assert done.returncode == 1 and done.stderr.splitlines() == [
        f"error: {venv} was not made by this scripts/bootstrap from this pyproject.toml with PITFALLS_TORCH={TORCH} "
        f"and the extras {asked or 'test,bench'}; make it with: PITFALLS_VENV={venv} bash scripts/bootstrap"]


def test_an_extra_the_project_does_not_have_is_one_line_and_exit_2(tmp_path: Path):
    done = check(tmp_path / "venv", None, PITFALLS_EXTRAS="bench,docs")
    assert done.returncode == 2 and done.stderr.splitlines() == [
        "error: PITFALLS_EXTRAS=bench,docs names the extra 'docs'; allowed: test, bench (comma-separated)"]
    assert not (tmp_path / "venv" / ".pitfalls-installed").exists()


def test_the_main_jobs_scripts_ask_for_the_bench_extra_and_the_image_holds_it():
    for script in ("run-suite", "run-history", "compare"):
        text = (ROOT / "scripts" / script).read_text()
        assert "PITFALLS_EXTRAS=${PITFALLS_EXTRAS:-bench} bash scripts/bootstrap" in text, script
    assert "RUN PITFALLS_EXTRAS=bench bash scripts/bootstrap" in (ROOT / "Dockerfile").read_text()

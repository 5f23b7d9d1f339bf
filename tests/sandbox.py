"""A throw-away copy of this checkout as its own git repository, to run the scripts against for real.

The copy is a clone of this checkout's history with the working tree (tracked and untracked, not ignored files)
committed on top, and uses the test run's own virtual environment (``PITFALLS_VENV``), so scripts/bootstrap has
nothing to install.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from committed import INPUTS

ROOT = Path(__file__).resolve().parents[1]
VENV = Path(sys.prefix)
GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.invalid"}


def bootstrap_digest() -> str:
    """The first field of the stamp scripts/bootstrap writes: what made the venv (pyproject.toml and the script)."""
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + (ROOT / "scripts" / "bootstrap").read_bytes())
    return digest.hexdigest()[:16]


def not_bootstrapped() -> str | None:
    """Why the scripts would reinstall the test venv (they must not: it is installed from this checkout), or None."""
    want = [bootstrap_digest(), os.environ.get("PITFALLS_TORCH", "torch==2.13.0")]
    stamp = VENV / ".pitfalls-installed"
    made = stamp.read_text().split() if stamp.is_file() else []
    # Made from this checkout with both extras (the scripts in a sandbox ask for the bench one).
    if made[:2] != want or len(made) != 3 or not {"test", "bench"} <= set(made[2].split(",")):
        return f"{VENV} is not bootstrapped from this checkout (run bash scripts/bootstrap)"
    return None


@pytest.fixture(scope="module", autouse=True)
def bootstrapped() -> None:
    """Autouse in a module that imports it. The scripts would reinstall the test venv from a sandbox: a venv not
    made by scripts/bootstrap fails here, it is not a reason to skip the module."""
    reason = not_bootstrapped()
    if reason is not None:
        pytest.fail(reason)


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), "-c", "commit.gpgsign=false", "-c", "core.hooksPath=/dev/null",
                           *args], env={**os.environ, **GIT_ENV}, capture_output=True, text=True, check=True)
    return done.stdout


def make_sandbox(dest: Path, root: Path = ROOT) -> Path:
    """Clone this checkout's (``root``'s) history into ``dest`` (branch ``main``) and commit its working tree on top,
    but for ``results/`` and ``proof/``, which stay HEAD's.

    With the history, a published site can place the committed results' commits next to the new ones. The results
    a user's own main job leaves in the working tree are that user's, not the code under test: committed in the
    sandbox they would become its committed results, and every page generated from those would read stale.
    """
    subprocess.run(["git", "clone", "-q", str(root), str(dest)], check=True)
    git(dest, "checkout", "-q", "-B", "main")
    listed = subprocess.run(["git", "-C", str(root), "ls-files", "-co", "--exclude-standard", "-z"],
                            capture_output=True, text=True, check=True).stdout
    for relative in filter(None, listed.split("\0")):
        if relative.split("/", 1)[0] in INPUTS:  # what runs write: HEAD's, whatever the working tree holds
            continue
        source = root / relative
        if source.is_file():
            (dest / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / relative)
        else:  # deleted in the working tree
            (dest / relative).unlink(missing_ok=True)
    git(dest, "add", "-A")
    if git(dest, "status", "--porcelain"):
        git(dest, "commit", "-qm", "the working tree")
    return dest


def script_env(home: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "HOME": str(home), "PITFALLS_VENV": str(VENV), "PITFALLS_GRID": "quick", **extra}


def run_script(repo: Path, script: str, *args: str, home: Path, timeout: float = 900,
               **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(repo / "scripts" / script), *args], cwd=repo, env=script_env(home, **extra),
                          capture_output=True, text=True, timeout=timeout, check=False)


def start_script(repo: Path, script: str, *args: str, home: Path, **extra: str) -> subprocess.Popen:
    """Start a script in its own session (so a failing test can still stop everything it started)."""
    return subprocess.Popen(["bash", str(repo / "scripts" / script), *args], cwd=repo, env=script_env(home, **extra),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def tree_digest(folder: Path) -> dict[str, str]:
    """sha256 of every file under ``folder``."""
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def other_processes(test: Callable[[psutil.Process], bool]) -> list[psutil.Process]:
    """Live processes other than this one that pass ``test`` (one that vanishes or cannot be read does not)."""
    found = []
    for process in psutil.process_iter():
        if process.pid == os.getpid():
            continue
        try:
            if test(process) and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except (psutil.Error, OSError):
            continue
    return found


def marked(marker: str, variable: str = "PITFALLS_RUN") -> list[psutil.Process]:
    """Live processes (other than this one) whose environment carries ``variable=marker``."""
    return other_processes(lambda process: process.environ().get(variable) == marker)


def alive(processes: list[psutil.Process]) -> list[psutil.Process]:
    live = []
    for process in processes:
        try:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                live.append(process)
        except psutil.Error:
            continue
    return live

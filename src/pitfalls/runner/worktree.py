"""The git state a run is recorded under: HEAD, and whether the working tree differs from it."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterable
from pathlib import Path

from pitfalls.runner.conf import RunnerError

__all__ = ["changed_files", "commit_of", "describe_changes"]


def _git(root: Path, *args: str) -> str:
    try:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=False)
    except FileNotFoundError as error:
        raise RunnerError("git is not installed; asv records each result under the commit it measured") from error
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [f"git {' '.join(args)} failed"])[-1]
        raise RunnerError(f"{root}: {last}; asv records each result under a commit of a git checkout")
    return done.stdout


def commit_of(root: str | os.PathLike[str], name: str = "HEAD") -> str:
    """The full hash of the commit ``name`` (a hash, branch, tag or ``HEAD~2``) names."""
    try:
        return _git(Path(root), "rev-parse", "--verify", "--end-of-options", f"{name}^{{commit}}").strip()
    except RunnerError as error:
        raise RunnerError(f"not a commit of {root}: {name!r}") from error


def changed_files(root: str | os.PathLike[str], ignore: Iterable[str | os.PathLike[str]] = ()) -> list[str]:
    """Files that differ from HEAD (modified, staged, deleted or untracked and not ignored), relative to ``root``.

    Args:
        root: the checkout.
        ignore: folders whose changes do not count (the results and the site a run writes itself).
    """
    folder = Path(root).resolve()
    excludes = []
    for path in ignore:
        resolved = Path(path).resolve()
        if resolved.is_relative_to(folder) and resolved != folder:
            excludes.append(f":(exclude){resolved.relative_to(folder).as_posix()}")
    out = _git(folder, "status", "--porcelain=v1", "-z", "--untracked-files=all", "--", ".", *excludes)
    entries = iter(entry for entry in out.split("\0") if entry)
    files: list[str] = []
    for entry in entries:
        files.append(entry[3:])
        if "R" in entry[:2] or "C" in entry[:2]:
            next(entries, None)  # the source path of a rename or a copy
    return files


def describe_changes(files: list[str], shown: int = 5) -> str:
    """``a.py, b.py and 3 more``."""
    head = ", ".join(files[:shown])
    return head if len(files) <= shown else f"{head} and {len(files) - shown} more"

"""The committed inputs of the generated pages: HEAD's results/ and proof/, as git has them.

A user's main job (`bash scripts/run-suite`) adds its own results file under results/ and may rewrite its
machine's machine.json; `pitfalls gpu-run` merges into results/ and proof/. The tests that hold the committed pages
to what generation gives read HEAD's copy of these two folders, so that such a run leaves them green, while
`python -m pitfalls.docs` reads the working tree and names the pages the new results make stale. Everything else
generation reads (the registry, pyproject.toml's layers, benchmarks/series.json, the pages and pictures) is the
working tree's: it is the code and the pages under test, which no run writes.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The folders a run writes, read at HEAD.
INPUTS = ("results", "proof")
# The pages and what the generated blocks read besides the folders above, copied from the working tree.
PAGES = ("README.md", "docs")
SOURCES = ("pyproject.toml", "benchmarks/series.json")


class NotACheckout(RuntimeError):
    """The folder is no git checkout with a commit: what is committed cannot be told from what a run added."""


def _git(root: Path, *args: str, stdin: bytes | None = None) -> bytes:
    try:
        done = subprocess.run(["git", "-C", str(root), *args], input=stdin, capture_output=True, timeout=120,
                              check=False)
    except FileNotFoundError:
        raise NotACheckout(f"{root}: git is not installed, so HEAD's {' and '.join(INPUTS)} cannot be read") from None
    if done.returncode != 0:
        said = done.stderr.decode(errors="replace").strip().splitlines()
        raise NotACheckout(f"{root} is no git checkout with a commit (git {args[0]}: {said[0] if said else 'failed'}"
                           f"): the committed pages are held to HEAD's {'/ and '.join(INPUTS)}/, which only git "
                           "tells apart from a run's own results; run the tests from a clone, or check this folder's "
                           "pages against its own files with `python -m pitfalls.docs`")
    return done.stdout


def head_inputs(dest: Path, root: Path = ROOT) -> Path:
    """Write HEAD's results/ and proof/ of the checkout ``root`` under ``dest``: untracked files and uncommitted
    changes left out.

    Args:
        dest: a new folder.
        root: the checkout.

    Returns:
        ``dest``.

    Raises:
        NotACheckout: ``root`` is not a git checkout with a HEAD commit (an sdist, a copied folder), or git is missing.
    """
    names = [n for n in _git(root, "ls-tree", "-r", "-z", "--name-only", "HEAD", "--", *INPUTS).split(b"\0") if n]
    # One `git cat-file --batch` for every file: each answer is "<sha> blob <size>\n<content>\n", in order.
    out = _git(root, "cat-file", "--batch", stdin=b"".join(b"HEAD:" + name + b"\n" for name in names))
    at = 0
    for name in names:
        header_end = out.index(b"\n", at)
        size = int(out[at:header_end].split()[2])
        target = dest / name.decode()
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(out[header_end + 1:header_end + 1 + size])
        at = header_end + 1 + size + 1
    dest.mkdir(parents=True, exist_ok=True)
    return dest


def generation_root(dest: Path, inputs: Path, root: Path = ROOT) -> Path:
    """A folder that `pitfalls.docs.Docs` generates from: the working tree's pages and sources, ``inputs``' folders.

    Args:
        dest: a new folder, written to by the tests that rewrite a page or a picture.
        inputs: a folder holding results/ and proof/ (`head_inputs`).
        root: the checkout whose pages and sources are copied.

    Returns:
        ``dest``.
    """
    for part in INPUTS:
        shutil.copytree(inputs / part, dest / part)
    for part in (*PAGES, *SOURCES):
        source, target = root / part, dest / part
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target)
        else:
            shutil.copy(source, target)
    return dest

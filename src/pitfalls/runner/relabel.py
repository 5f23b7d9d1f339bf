"""Relabel a results file of asv's ``existing`` environment as the ``installed`` environment that measured it.

Main-job results written before the ``installed`` environment existed are named after the interpreter's path
(``aa3a6c21-existing-py_work_main_.venv_bin_python3.json``, params ``python: /work/main/.venv/bin/python3`` and
no torch): in the site they form a series of their own. Given the Python and torch versions that path had, the
file is rewritten through asv's results API under ``installed-py<python>-torch<torch>`` with the params of that
environment, and the old file is removed. The figures are not touched.

``python -m pitfalls.runner relabel RESULTS_FILE --python 3.11 --torch 2.13.0``
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from pitfalls.asv_files import file_name, load
from pitfalls.runner import store
from pitfalls.runner.conf import RunnerError
from pitfalls.runner.job import report_errors

__all__ = ["main", "relabel"]

TOOL = "installed"  # the tool_name of pitfalls_asv.InstalledEnvironment


def relabel(path: str | os.PathLike[str], *, python: str, torch: str) -> Path:
    """Rewrite the results file ``path`` as the ``installed`` environment's; returns the new file's path.

    Raises:
        RunnerError: the file cannot be read, is not an ``existing`` environment's, or the new file exists.
    """
    from asv.environment import get_env_name

    source = Path(path).resolve()
    with store.readable():
        results = load(source)
    if not str(results.env_name).startswith("existing-"):
        raise RunnerError(f"{source}: environment {results.env_name!r} is not asv's `existing` one; nothing to do")
    env_name = get_env_name(TOOL, python, {"torch": torch}, {})
    relative = file_name(results.params["machine"], results.commit_hash, env_name)
    root = source.parent.parent
    if (root / relative).exists():
        raise RunnerError(f"{root / relative} exists already; merge the two with `pitfalls merge`")
    results._env_name = env_name
    results._python = python
    results._requirements = {"torch": torch}
    results._params = {**results.params, "python": python, "torch": torch}
    store.save_atomically(results, root, relative)
    source.unlink()
    return root / relative


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m pitfalls.runner relabel``."""
    parser = argparse.ArgumentParser(prog="python -m pitfalls.runner relabel", description=__doc__.splitlines()[0])
    parser.add_argument("file", help="a results file results/<machine>/<commit>-existing-py_....json")
    parser.add_argument("--python", required=True, help="the Python version of that interpreter, e.g. 3.11")
    parser.add_argument("--torch", required=True, help="the torch version it had, without a local label, e.g. 2.13.0")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)

    def run() -> int:
        print(f"{args.file} -> {relabel(args.file, python=args.python, torch=args.torch)}")
        return 0

    return report_errors(run)

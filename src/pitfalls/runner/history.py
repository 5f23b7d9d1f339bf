"""``scripts/run-history``: the suite over commits and torch versions, in asv's managed virtualenvs.

asv builds one virtualenv per torch version of asv.conf.json's matrix (``virtualenv-py3.11-torch2.13.0``, ...),
builds a wheel of each commit from git and installs it there (never the working tree), then runs this checkout's
benchmarks/ against it. Staging, machine facts, merging and publishing are the main job's
(:mod:`pitfalls.runner.job`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from pitfalls.runner.conf import CONF_NAME, RunnerError
from pitfalls.runner.job import JobOptions, report_errors, run_job, split_at_dashes

__all__ = ["environments_by_torch", "main"]


def environments_by_torch(conf_path: str | Path) -> dict[str, str]:
    """torch version -> asv environment name, for every entry of the configuration's matrix (asv's own reading)."""
    from asv.config import Config
    from asv.environment import get_environments

    conf = Config.load(str(conf_path))
    return {str(env.requirements.get("torch")): env.name for env in get_environments(conf, None, verbose=False)}


def select(conf_path: str | Path, torches: Sequence[str]) -> list[str]:
    """The environment names of the chosen torch versions (all of the matrix when none is chosen)."""
    by_torch = environments_by_torch(conf_path)
    missing = [version for version in torches if version not in by_torch]
    if missing:
        raise RunnerError(f"torch {', '.join(missing)} is not in {CONF_NAME}'s matrix (it has {', '.join(by_torch)}); "
                          "add it to matrix.req.torch to measure it")
    if not by_torch:
        raise RunnerError(f"{CONF_NAME} has no torch versions in matrix.req.torch")
    return [by_torch[version] for version in (torches or list(by_torch))]


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``[--torch VERSION]... [COMMITS] [--no-publish] [-- asv run options]`` and run."""
    args, extra = split_at_dashes(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="run-history", description="Run the suite over commits and torch versions "
                                     "in asv's managed virtualenvs, merge, publish.")
    parser.add_argument("commits", nargs="?", default="HEAD^!",
                        help="git range as asv takes it (default HEAD^!, the current commit), e.g. HEAD~3..HEAD, "
                        "or NEW (commits of the configured branches not measured yet)")
    parser.add_argument("--torch", action="append", default=[], metavar="VERSION",
                        help="only this torch version of the matrix (repeatable; default: every version)")
    parser.add_argument("--no-publish", dest="publish", action="store_false", help="merge the results only")
    parsed = parser.parse_args(args)
    root = Path.cwd()

    def run() -> int:
        history = [parsed.commits]
        for name in select(root / CONF_NAME, parsed.torch):
            history += ["-E", name]
        return run_job(JobOptions(root=root, history=tuple(history), asv_args=tuple(extra), publish=parsed.publish))

    return report_errors(run)

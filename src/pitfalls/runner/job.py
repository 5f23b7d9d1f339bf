"""The main job: check every variant, run asv on this checkout (or on commits), merge the results, publish.

``scripts/run-suite`` and ``scripts/run-history`` are thin wrappers over :func:`run_job`; docs/asv.md ("Running
it") gives its steps in order. Why uncommitted changes go to a machine of their own: asv records a result under
a commit hash and nothing else (``--set-commit-hash`` only accepts a commit of the repository), so the label left
to choose is the machine or the environment, and only ``results/<machine>-dirty/`` can never share a file with
clean results of the same commit. SIGTERM and SIGINT stop asv, its forkserver and every benchmark process (found
by the run's marker, see :mod:`pitfalls.runner.processes`), remove the staging folder, leave results/ as it was,
and exit with 128 + the signal number.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from pitfalls import asv_files
from pitfalls.grids import COMPILE_FAILURES_ENV, chosen_grid
from pitfalls.runner import processes, store
from pitfalls.runner.conf import CONF_NAME, RunnerError, project_paths
from pitfalls.runner.gate import gated_families
from pitfalls.runner.machine import DIRTY_SUFFIX, MachineRecord, hardware, machine_name, record_machine
from pitfalls.runner.progress import Durations, Progress, durations_of, newest_durations, time_table
from pitfalls.runner.staged import StagedRun, run_staged
from pitfalls.runner.staging import Stage, remove_stale
from pitfalls.runner.worktree import changed_files, commit_of, describe_changes

__all__ = ["INSTALLED_ENV", "Interrupted", "JobOptions", "in_stage", "main", "prepare_machine", "run_job", "run_marked"]

INSTALLED_ENV = "installed:same"
MACHINE_ENV = "PITFALLS_MACHINE"
STAGING = Path(".asv") / "staging"
UNMERGED = Path(".asv") / "unmerged"


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class Interrupted(Exception):
    """SIGTERM or SIGINT arrived."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextmanager
def signals_raise() -> Iterator[None]:
    """Turn SIGTERM and SIGINT into :class:`Interrupted` in this (main) thread for the duration."""

    def handler(signum: int, _frame: FrameType | None) -> None:
        raise Interrupted(signum)

    previous = {signum: signal.signal(signum, handler) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


@dataclass(frozen=True)
class JobOptions:
    """What one job runs.

    Attributes:
        root: the checkout (holds asv.conf.json).
        asv_args: extra ``asv run`` arguments (``-b``, ``--show-stderr``...).
        history: ``asv run`` range and ``-E`` arguments of a history run; empty for the main job (this
            checkout in the installed environment).
        allow_dirty: record a run of a working tree that differs from HEAD, under ``<machine>-dirty``.
        publish: publish the site after merging.
    """

    root: Path
    asv_args: tuple[str, ...] = ()
    history: tuple[str, ...] = ()
    allow_dirty: bool = False
    publish: bool = True


def prepare_machine(results_dir: Path, suffix: str = "") -> MachineRecord:
    """Measure this machine, name it (``$PITFALLS_MACHINE`` overrides) and record its full facts for asv.

    Args:
        results_dir: the results folder whose machine.json holds facts already recorded.
        suffix: appended to the name (``-dirty``).
    """
    facts = hardware()
    base = os.environ.get(MACHINE_ENV) or machine_name(facts)
    record = record_machine(base + suffix, results_dir, facts, base_name=base)
    for line in record.describe_kept():
        log(line)
    return record


def _check_dirty(options: JobOptions, ignore: Sequence[Path]) -> str:
    """The machine-name suffix of this run: "" for a clean tree; refuses a dirty one without --allow-dirty."""
    changed = changed_files(options.root, ignore)
    if not changed:
        return ""
    listed = describe_changes(changed)
    if not options.allow_dirty:
        raise RunnerError(f"the working tree differs from HEAD ({listed}); commit or stash the changes, or pass "
                          f"--allow-dirty to record this run under the machine <machine>{DIRTY_SUFFIX}")
    log(f"== uncommitted changes ({listed}): recording under the machine <machine>{DIRTY_SUFFIX}, not as HEAD")
    return DIRTY_SUFFIX


def _keep_unmerged(root: Path, stage: Stage) -> Path:
    kept = root / UNMERGED / stage.path.name
    if kept.exists():
        shutil.rmtree(kept)
    kept.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(stage.results), str(kept))
    return kept


def run_marked(command: Sequence[str], stage: Stage, env: dict[str, str] | None = None,
               progress: Progress | None = None) -> int:
    """Run ``command`` as a process of the job (marked, in its own session); stops the run's processes on a signal.

    With ``progress``, the command's output passes through it (what runs, the time left).
    """
    piped = {} if progress is None else {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True,
                                         "bufsize": 1}
    child = processes.start(command, marker=stage.marker, env=env, **piped)
    try:
        if progress is not None:
            assert child.stdout is not None
            progress.follow(child.stdout)
        return child.wait()
    except Interrupted:
        processes.stop(stage.marker, extra=[child])
        raise


def _this_run(folder: Path, since: float) -> Durations:
    """The durations of the results file the run just wrote under ``folder`` (none when it wrote none)."""
    listed = (folder.parent / name for name in asv_files.result_files(folder.parent, folder.name))
    written = [p for p in listed if p.stat().st_mtime >= since]
    return durations_of(max(written, key=lambda p: p.stat().st_mtime)) if written else Durations()


def _measure(options: JobOptions, stage: Stage, paths: dict[str, Path], suffix: str, grid: str,
             merged: list[str]) -> int:
    results_dir = paths["results_dir"]
    # A run limited by -b to some families' benchmarks proves those families: what it measures.
    families = gated_families(options.asv_args, paths["benchmark_dir"])
    gate = [sys.executable, "-m", "pitfalls.cli", "check", *(f"--family={name}" for name in families or ())]
    log("== equivalence: every variant against naive"
        + (f" (of the families -b selects: {', '.join(families)})" if families else ""))
    status = run_marked(gate, stage)
    if status != 0:
        log(f"pitfalls check failed (exit {status}): nothing was measured; results/ is unchanged")
        return status
    record = prepare_machine(results_dir, suffix)
    facts = ", ".join(f"{key} {value}" for key, value in sorted(record.facts.items()) if key != "machine")
    log(f"== machine {record.name} ({facts})")
    run_args = list(options.history) or ["-E", INSTALLED_ENV, "--set-commit-hash", commit_of(options.root)]
    log(f"== asv run {' '.join(run_args + list(options.asv_args))} (grid {grid})")
    # The run's benchmark processes share its compile crashes (`COMPILE_FAILURES_ENV`): a case whose compile
    # crashed is skipped with that reason by the later figures of the run, rather than compiled again for each.
    env = dict(os.environ, TMPDIR=str(stage.tmp), PITFALLS_GRID=grid,
               **{COMPILE_FAILURES_ENV: str(stage.path / "compile-failures.jsonl")})
    # The main job's own environment (installed-py<X.Y>-torch<version>) first; history runs take any.
    expected = newest_durations(results_dir, record.name, "installed-*")
    started = time.time()

    def publish(written: list[str]) -> int:
        for relative in written:
            log(f"  {results_dir.name}/{relative}")
        log(f"== {len(written)} results file(s) merged into {results_dir}")
        if not options.publish:
            return 0
        log("== publishing the HTML site")
        return run_marked([sys.executable, "-m", "pitfalls.site.localize", "--config", str(options.root / CONF_NAME)],
                          stage)

    run = StagedRun(options.root, results_dir, stage.path, record.name, (*run_args, *options.asv_args))
    try:
        done = run_staged(run, lambda command: run_marked(command, stage, env, Progress(expected)),
                          lambda written: merged.extend(written or ["(nothing new)"]), publish)
    except RunnerError as error:
        kept = _keep_unmerged(options.root, stage)
        raise RunnerError(f"{error}; the measured results are kept in {kept}: once fixed, merge them with "
                          f"`pitfalls merge {kept} --out {results_dir}`") from error
    status = done.status
    run_durations = _this_run(stage.results / record.name, started)
    if done.merged is None:
        log(f"asv run failed (exit {status}); results/ is unchanged")
        return status
    if done.after != 0:
        log(f"publishing failed (exit {done.after}); the results are merged")
        return done.after
    if run_durations.benchmarks:
        log(f"== where the time went ({Path(run_durations.source).name}, asv's durations)")
        for line in time_table(run_durations):
            log(f"  {line}")
    log(f"Results: {results_dir}/{record.name}/   Site: {paths['html_dir']}/index.html "
        "(serve it with: bash scripts/serve html)")
    if status == 2:
        log("some benchmarks failed (asv exit 2); see the log above")
    return status


def in_stage(root: Path, body: Callable[[Stage], int], interrupted_note: Callable[[], str] = lambda: "") -> int:
    """Run ``body`` with a fresh staging folder, turning SIGTERM/SIGINT into a clean stop; returns its status.

    Staging folders of killed runs are removed first. On a signal every process the job started is stopped, the
    staging folder is removed, and the status is 128 + the signal number.
    """
    remove_stale(root / STAGING, log)
    with signals_raise(), Stage(root / STAGING) as stage:
        # Every process the job starts inherits the marker, so all of them can be found and stopped.
        os.environ[processes.MARKER] = stage.marker
        try:
            return body(stage)
        except Interrupted as stop:
            for signum in (signal.SIGTERM, signal.SIGINT):  # a second Ctrl-C must not cut the clean-up short
                signal.signal(signum, signal.SIG_IGN)
            processes.stop(stage.marker)
            log(f"interrupted by {stop}: asv and its processes stopped, staging removed{interrupted_note()}")
            return 128 + stop.signum
        finally:
            del os.environ[processes.MARKER]


def checked_grid() -> str:
    """The grid this run's environment names.

    Raises:
        RunnerError: ``PITFALLS_GRID`` or ``PITFALLS_ROUNDS`` holds a value that is not allowed.
    """
    try:
        name, _ = chosen_grid(os.environ)
    except ValueError as error:
        raise RunnerError(f"{error}; nothing was measured") from error
    return name


def run_job(options: JobOptions) -> int:
    """Run the main job (or a history run); returns the exit status.

    Raises:
        RunnerError: a problem found before anything was measured (a grid or rounds not allowed, broken
            configuration, results/ or html/ not writable, a dirty working tree, a merge that could not be written).
    """
    # Before asv: its import of the suite would fail on a bad grid with a traceback.
    grid = checked_grid()
    paths = project_paths(options.root / CONF_NAME)
    store.check_writable(paths["results_dir"], *([paths["html_dir"]] if options.publish else []))
    suffix = "" if options.history else _check_dirty(options, [paths["results_dir"], paths["html_dir"]])
    merged: list[str] = []
    return in_stage(options.root, lambda stage: _measure(options, stage, paths, suffix, grid, merged),
                    lambda: "; the results were merged before it" if merged else "; results/ is unchanged")


def main(argv: Sequence[str] | None = None) -> int:
    """``scripts/run-suite``: the main job on this checkout (the current folder); other arguments go to asv run."""
    parser = argparse.ArgumentParser(prog="run-suite", description="The main job: check every variant, run the asv "
                                     "suite on this checkout, merge, publish. Other arguments go to `asv run` (e.g. -b "
                                     "SyncHazards --show-stderr).")
    parser.add_argument("--allow-dirty", action="store_true",
                        help=f"measure a working tree that differs from HEAD, recorded under <machine>{DIRTY_SUFFIX}")
    parser.add_argument("--no-publish", dest="publish", action="store_false", help="merge the results only")
    args, asv_args = parser.parse_known_args(sys.argv[1:] if argv is None else list(argv))
    options = JobOptions(root=Path.cwd(), asv_args=tuple(asv_args), allow_dirty=args.allow_dirty,
                         publish=args.publish)
    return report_errors(lambda: run_job(options))


def split_at_dashes(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """``(own arguments, arguments after --)``: what a script parses, and what it hands to asv unread."""
    args = list(argv)
    at = args.index("--") if "--" in args else len(args)
    return args[:at], args[at + 1 :]


def report_errors(run: Callable[[], int]) -> int:
    """Run ``run``; a :class:`RunnerError` becomes one line on stderr and exit status 2."""
    try:
        return run()
    except RunnerError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2



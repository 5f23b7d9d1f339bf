"""One ``asv run`` of the checkout in a staged configuration, its results merged back under the folder's lock.

asv writes into a copy of the results folder, in a folder of the run's own, through a copy of asv.conf.json that
names that copy; when asv has finished, the entries it measured are merged into the results folder under its lock,
signals held, each file replaced by an atomic rename. A run stopped part-way, or one whose asv fails, leaves the
results folder exactly as it was. The main job (`pitfalls.runner.job`) and the budgeted GPU run's asv slices
(`pitfalls.gpu_run.slices`) both run asv this way.
"""

from __future__ import annotations

import shutil
import signal
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pitfalls.runner import store
from pitfalls.runner.conf import CONF_NAME, write_staged_conf
from pitfalls.runner.machine import record_machine
from pitfalls_asv_main import command as asv_command

__all__ = ["Staged", "StagedRun", "run_staged"]


@contextmanager
def _signals_deferred() -> Iterator[None]:
    """Hold SIGTERM and SIGINT back (they arrive when this ends): a merge must not stop half-way."""
    held = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, held)


@dataclass(frozen=True)
class StagedRun:
    """One ``asv run`` to stage.

    Attributes:
        root: the checkout, whose asv.conf.json is staged.
        results: the results folder the run's entries are merged into.
        stage: a folder of the run's own: the staged configuration and ``results/``, the copy asv writes into.
        machine: the asv machine the results go under.
        args: the ``asv run`` arguments after ``--machine``.
        facts: the machine's facts, recorded in the copy before asv runs (None: the caller recorded them).
    """

    root: Path
    results: Path
    stage: Path
    machine: str
    args: tuple[str, ...]
    facts: Mapping[str, Any] | None = None

    @property
    def staged_results(self) -> Path:
        """The copy asv writes into."""
        return self.stage / "results"


@dataclass(frozen=True)
class Staged:
    """What a staged run did.

    Attributes:
        status: asv's exit status (2: some case failed, its failure recorded as a result).
        merged: the results files merged, relative to the results folder; None when asv failed and nothing was.
        after: the status of what ran after the merge, under the lock (0 when nothing did).
    """

    status: int
    merged: list[str] | None
    after: int = 0


def run_staged(run: StagedRun, launch: Callable[[Sequence[str]], int],
               on_merged: Callable[[list[str]], None] = lambda _: None,
               after_merge: Callable[[list[str]], int] = lambda _: 0) -> Staged:
    """Stage the configuration and a copy of the results, run asv with ``launch``, merge what it measured.

    Args:
        run: what to run, and where.
        launch: runs asv's command line in the checkout; returns its exit status.
        on_merged: told the files merged before signals are let through again (a caller that must know even when
            a signal ends the run right after the merge).
        after_merge: called with the files merged while the results folder is still locked, signals let through
            (the main job publishes its site there); returns a status.

    Raises:
        RunnerError: the merge could not be written; the measured results stay in ``run.staged_results``.
    """
    # asv reads earlier results (which commits exist, what to skip) and adds to them; no lock is needed for the
    # copy: every file under results/ is replaced by an atomic rename, so each copy is of one whole version.
    if run.results.is_dir():
        shutil.copytree(run.results, run.staged_results, ignore=shutil.ignore_patterns(store.LOCK_NAME, "*.partial-*"))
    else:
        run.staged_results.mkdir(parents=True)
    before = store.snapshot(run.staged_results)
    if run.facts is not None:
        record_machine(run.machine, run.staged_results, dict(run.facts))
    conf = write_staged_conf(run.root / CONF_NAME, run.stage, results_dir=run.staged_results)
    status = launch([*asv_command(sys.executable), "run", "--config", str(conf), "--machine", run.machine, *run.args])
    if status not in (0, 2):
        return Staged(status, None)
    with store.locked(run.results):
        with _signals_deferred():
            merged = store.merge_into(run.staged_results, run.results, before=before)
            on_merged(merged)
        after = after_merge(merged)
    return Staged(status, merged, after)

"""`pitfalls doctor --try`: the DataLoader's settings tried on the user's own script, each measured in a fresh process
(`pitfalls.doctor.try_child`), not advised (docs/doctor.md, "--try").
"""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pitfalls import processes
from pitfalls.doctor.options import DoctorOptions
from pitfalls.doctor.report import DoctorReport, LoaderFigures
from pitfalls.doctor.try_child import LoaderSetting, Trial, describe
from pitfalls.families.loader.steady import MIN_BATCHES, TIMED_PER_PREFILLED, prefilled

__all__ = ["AUTO", "DIGESTS", "Tried", "TryRow", "choose", "trial_steps", "try_settings"]

AUTO = "loader"
# Batches whose digests must match for a setting to be a fix.
DIGESTS = 4
# DataLoader's default prefetch_factor with workers.
DEFAULT_PREFETCH = 2
# Seconds a trial may take past its own budget (the interpreter's and torch's import) before it is stopped.
START_S = 120.0


@dataclass(frozen=True)
class TryRow:
    """One setting, measured (docs/doctor.md, "--try").

    Attributes:
        setting: the setting as the command line writes it ("as written": the script's own).
        step_ms: the median timed step, ms.
        speedup: the script's own mean step over this one's (None when either was not timed).
        same_batches: its first batches equal the script's own (None: not judged, ``note`` says why).
        fix: the setting ranked as the fix: the fastest with the same batches, faster than the script's own.
        note: why a figure is missing ("" when none is).
    """

    setting: str
    workers: int | None
    step_ms: float | None
    mean_ms: float | None
    wait_share: float | None
    speedup: float | None
    same_batches: bool | None
    fix: bool = False
    note: str = ""

    def as_json(self) -> dict[str, Any]:
        """The row as the JSON report's ``try`` entry."""
        return asdict(self)


@dataclass(frozen=True)
class Tried:
    """The settings tried, the script's own first, or why none was (``note``, also why the batches were not judged);
    ``steps``: (warm-up, timed) steps of every trial."""

    rows: tuple[TryRow, ...]
    note: str = ""
    steps: tuple[int, int] = (0, 0)

    @property
    def best(self) -> TryRow | None:
        """The row ranked as the fix, if any."""
        return next((row for row in self.rows if row.fix), None)


def choose(loader: LoaderFigures | None, step_ms: float | None, gpu: bool, available: int
           ) -> tuple[list[dict[str, int | bool]], str]:
    """The settings `--try loader` tries, or none and why.

    Args:
        loader: the loader's figures over the doctor's timed steps (None: no DataLoader was seen).
        step_ms: the mean timed step, ms.
        gpu: the script used a GPU (pinned memory is then tried too).
        available: the cores.

    Returns:
        (settings, why none): the settings, or an empty list and the reason.
    """
    if loader is None or step_ms is None:
        return [], "the timed steps took no batch from a DataLoader"
    if loader.workers and loader.verdict != "loader-bound":
        return [], f"the loader keeps up with the step ({loader.verdict}, {loader.workers} workers)"
    extra: dict[str, int | bool] = {"persistent_workers": True}
    if gpu:
        extra["pin_memory"] = True
    rest_ms = max(step_ms - loader.ms_per_step, 1e-3)
    hide = max(1, math.ceil(loader.ms_per_step / rest_ms))
    counts = sorted({min(hide, available), available} - {loader.workers})
    if not counts:
        return [], f"the loader already has {loader.workers} workers, one per core"
    return [{"num_workers": count, **extra} for count in counts], ""


def trial_steps(options: DoctorOptions, workers: Sequence[tuple[int, int]]) -> tuple[int, int]:
    """(warm-up, timed) steps of every trial: the batches the largest setting makes ahead taken in warm-up, and ten
    times as many timed, at least the doctor's own.

    Args:
        options: the doctor's steps.
        workers: (workers, prefetch_factor) of each setting tried, the script's own included.
    """
    ahead = max((prefilled(count, prefetch) for count, prefetch in workers), default=0)
    return options.warmup + ahead, max(options.steps, TIMED_PER_PREFILLED * ahead, MIN_BATCHES)


def _run_child(trial: Trial) -> dict[str, Any]:
    """Run one trial in a fresh interpreter; its result, or ``{"failure": ...}``."""
    with tempfile.TemporaryDirectory(prefix="pitfalls-try-") as folder:
        out = Path(folder) / "trial.json"
        spec = json.dumps({**asdict(trial), "args": list(trial.args)})
        try:
            # Through the one launcher: a trial stopped at its limit takes its DataLoader workers with it.
            done = processes.run([sys.executable, "-m", "pitfalls.doctor.try_child", spec, str(out)],
                                 timeout_s=trial.budget_s + START_S, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True)
        except subprocess.TimeoutExpired:
            return {"failure": f"the trial ran past {trial.budget_s + START_S:g} s and was stopped"}
        if done.returncode != 0 or not out.is_file():
            last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
            return {"failure": f"the trial failed: {last}"}
        return dict(json.loads(out.read_text(encoding="utf-8")))


def try_settings(report: DoctorReport, options: DoctorOptions, settings: Sequence[LoaderSetting],
                 run: Callable[[Trial], dict[str, Any]] = _run_child) -> Tried:
    """Run the script's own setting and each of ``settings`` in fresh processes; the table.

    Args:
        report: the doctor's run of the script (its batches' digests, its loader's workers).
        options: the doctor's steps and budget.
        settings: the settings to try.
        run: runs one trial (a test passes one that runs in this process).

    Returns:
        The rows, the fix ranked.
    """
    own_workers = report.loader.workers if report.loader is not None else 0
    shapes = [(own_workers, DEFAULT_PREFETCH)] + [
        (int(s.get("num_workers", own_workers)), int(s.get("prefetch_factor", DEFAULT_PREFETCH))) for s in settings]
    warmup, steps = trial_steps(options, shapes)

    def trial(setting: LoaderSetting) -> dict[str, Any]:
        return run(Trial(script=report.script, args=report.argv, setting=dict(setting), warmup=warmup, steps=steps,
                         digests=DIGESTS, budget_s=options.budget_s, cuda_on_cpu=options.cuda_on_cpu))

    tried: list[LoaderSetting] = [{}, *settings]
    results = [(setting, trial(setting)) for setting in tried]
    own = results[0][1]
    own_digests = tuple(own.get("digests") or ())
    note = ""
    if not own_digests:
        note = "the script's batches were not read: same batches not judged"
    elif own_digests != report.digests[:len(own_digests)]:
        note = "the script's own batches differ from run to run (unseeded?): same batches not judged"
    own_mean, rows = own.get("mean_ms"), []
    for setting, result in results:
        mean = result.get("mean_ms")
        failure = result.get("failure") or ("no step was timed" if mean is None else "")
        rows.append(TryRow(
            setting=describe(setting), workers=result.get("workers"), step_ms=result.get("median_ms"), mean_ms=mean,
            wait_share=result.get("wait_share"), speedup=own_mean / mean if own_mean and mean else None,
            same_batches=None if note or failure else tuple(result.get("digests") or ()) == own_digests,
            note=failure))
    fixes = [row for row in rows[1:] if row.same_batches and row.speedup is not None and row.speedup > 1.0]
    best = max(fixes, key=lambda row: row.speedup or 0.0, default=None)
    return Tried(tuple(dataclasses.replace(row, fix=row is best) for row in rows), note, (warmup, steps))

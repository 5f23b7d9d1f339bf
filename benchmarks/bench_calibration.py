"""The calibration family: planted costs (busy-wait 2T against T, k `.item()` against 0, N MiB touched).

The shared figures measured on known answers: ``Call.time_call`` reads T or 2T, ``Speedup.track_speedup`` 2.0,
``SyncHazards.track_sync_hazards`` k and 0, ``Call.peakmem_call`` N MiB above the process's own. The site shows
each instrument's reading over commits, machines and torch versions.

``Error.track_error`` (and ``ErrorIn<unit>.track_error`` for checks with an absolute tolerance) is the whole
calibration table over commits: one series per check of the shared instruments (the ones every family's figures read;
the families' own checks are published by committed `pitfalls calibrate --json` runs), holding its error. asv gives a
method one unit for all its parameters, so the checks are split by the unit of their error, a class each, made
here from the table of checks (a new absolute unit gets its own class).
"""

from typing import Any

from pitfalls import measure
from pitfalls.calibration import published, run
from pitfalls.devices import cuda_available
from pitfalls.probes import Unavailable

from . import common, shapes

# A series that ended: the loader's epoch start with persistent workers (the one error in ms) is published by the
# committed `pitfalls calibrate --json` runs with the rest of the families' own checks (`published.published_checks`).
RETIRED = ("bench_calibration.ErrorInMs.track_error",)


class Call(shapes.Time):
    """One call of a planted cost, synchronized."""

    family = "calibration"

    def time_call(self, *params: Any) -> None:
        measure.step(self.case)

    def peakmem_call(self, *params: Any) -> None:
        measure.step(self.case)


class SyncHazards(shapes.SyncHazards):
    """naive: k `.item()` calls; half: none."""

    family = "calibration"

    def track_sync_hazards(self, *params: Any) -> int:
        return measure.sync_hazards(self.case)


class Speedup(shapes.Speedup):
    family = "calibration"

    def track_speedup(self, *params: Any) -> float:
        return common.speedup(self.naive_case, self.case)


class _CalibrationError(common.Benchmark):
    """A calibration check's error (`pitfalls calibrate`'s ``error`` column), whatever its verdict: relative to the
    planted value, or in the check's unit where its tolerance is absolute. One process per check."""

    param_names = [published.CHECK_PARAM]
    timeout = 600

    def setup(self, check: str) -> None:
        # n/a with the reason where the check cannot run here (a CUDA check without a CUDA device), never 0.
        error = published.measured_error(check, "cuda" if cuda_available() else "cpu")
        if isinstance(error, Unavailable):
            common.skip(error.reason)
        self.error = error

    def track_error(self, check: str) -> float:
        return self.error


def error_classes(module: str) -> dict[str, type]:
    """One `_CalibrationError` class per unit of error, whose ``check`` axis is every check with an error in it."""
    return {published.error_class_name(unit): type(published.error_class_name(unit), (_CalibrationError,), {
        "params": [names], "units": {published.ERROR_METHOD: unit}, "__module__": module,
        "__qualname__": published.error_class_name(unit),
        "__doc__": f"{(_CalibrationError.__doc__ or '').strip()}\n\nThe checks whose error is in {unit!r}."})
        for unit, names in published.checks_by_error_unit(run.all_checks()).items()}


globals().update(error_classes(__name__))

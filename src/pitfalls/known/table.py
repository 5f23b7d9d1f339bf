"""The calibration table: known-answer workloads (checks), what each measured (readings) and their verdicts (rows).

docs/methodology.md describes the table. A figure is calibrated when a check names its instrument key: a shared
figure's key below (`TIME_PER_CALL`, ...), a family's own figure's `own_instrument(family, figure_name)`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from pitfalls.result import Unavailable

__all__ = [
    "COMPILE_SECONDS",
    "CPU",
    "CUDA",
    "CUDA_EVENT_TIME",
    "CUDA_PEAK_MEMORY",
    "CUDA_SYNCS",
    "Check",
    "GRAPH_BREAKS",
    "GROUP_MEMORY",
    "SHM_IN_FLIGHT",
    "NVML_BUSY",
    "NVML_MEMORY",
    "PEAK_MEMORY",
    "RECOMPILES",
    "Reading",
    "Row",
    "SPEEDUP",
    "SYNC_HAZARDS",
    "TIME_PER_CALL",
    "calibrated_instruments",
    "own_instrument",
    "verdict",
]

CPU = "cpu"
CUDA = "cuda"

# Keys of the shared figures (one per asv benchmark method of the figures every family has, benchmarks/shapes.py).
TIME_PER_CALL = "time per call"
SPEEDUP = "speedup"
PEAK_MEMORY = "peak memory"
SYNC_HAZARDS = "sync hazards"
CUDA_SYNCS = "cuda syncs"
CUDA_EVENT_TIME = "cuda event time"
CUDA_PEAK_MEMORY = "cuda peak memory"
GRAPH_BREAKS = "graph breaks"
# torch.compile time of a case: the first call less a steady call (`CompileReport.compile_s`).
COMPILE_SECONDS = "compile seconds"
RECOMPILES = "recompiles"
NVML_BUSY = "nvml busy"
NVML_MEMORY = "nvml memory"
# Memory of a process group (pitfalls.probes.group_memory): USS/PSS sums over a root and its descendants.
GROUP_MEMORY = "group memory"
SHM_IN_FLIGHT = "shared memory in flight"


def own_instrument(family: str, figure: str) -> str:
    """The instrument key of a family's own figure (the name its ``own_figures`` gives it)."""
    return f"{family}: {figure}"


@dataclass(frozen=True)
class Reading:
    """What one known-answer workload planted and what the instrument read.

    Attributes:
        planted: the known answer, in the check's unit.
        measured: what the figure read, or `Unavailable` with the reason it could not be read here.
        detail: one line on how it was read (samples, rounds, the spread), for the table's last column.
    """

    planted: float
    measured: float | Unavailable
    detail: str = ""


@dataclass(frozen=True)
class Check:
    """One known-answer workload for one or more instruments.

    Attributes:
        name: unique, short and stable: the row's name in the table and the asv parameter value
            ("time: busy-wait 5 ms").
        instruments: the figures it calibrates (the keys above, or `own_instrument`).
        unit: the unit of planted and measured ("ms", "x", "MiB", "syncs", "samples/s").
        tolerance: the largest error allowed: relative to the planted value (0.10 is 10 %), or in the unit when
            ``absolute``; 0 means exact.
        measure: ``measure(device) -> Reading``; runs the workload through the suite's own code path.
        device: "cpu" or "cuda"; a CUDA check on a machine without CUDA reads "not run here" with the reason.
        family: the family whose code path it exercises; "" for the shared probes.
        absolute: the tolerance is in the unit, not relative.
        why: one line: why this tolerance (the spread measured on which machine).
        published: asv publishes its error as a series (`pitfalls.calibration.published`); False for a check of a
            command's figures (the doctor's) rather than a benchmark's, run by `pitfalls calibrate` alone.
    """

    name: str
    instruments: tuple[str, ...]
    unit: str
    tolerance: float
    measure: Callable[[str], Reading] = field(repr=False)
    device: str = CPU
    family: str = ""
    absolute: bool = False
    why: str = ""
    published: bool = True

    def __post_init__(self) -> None:
        if not self.name.strip() or not self.instruments:
            raise ValueError(f"check {self.name!r}: a check needs a name and at least one instrument")
        if self.device not in (CPU, CUDA):
            raise ValueError(f"check {self.name!r}: device={self.device!r} is not allowed; allowed: cpu, cuda")
        if not self.tolerance >= 0:
            raise ValueError(f"check {self.name!r}: tolerance must be >= 0, got {self.tolerance!r}")


@dataclass(frozen=True)
class Row:
    """One line of the calibration table: a check's planted value, measured value, error and verdict.

    Attributes:
        check: the check's name.
        instruments: the figures it calibrates.
        unit: the unit of planted and measured.
        planted: the known answer.
        measured: the reading, or None when it was not run (``reason`` says why).
        error: relative error (or absolute, when ``absolute``); None when not run.
        tolerance: the largest error allowed.
        absolute: whether ``error`` and ``tolerance`` are in the unit.
        verdict: "pass", "fail" or "not run".
        reason: why it was not run, or the reading's detail.
    """

    check: str
    instruments: tuple[str, ...]
    unit: str
    planted: float
    measured: float | None
    error: float | None
    tolerance: float
    absolute: bool
    verdict: str
    reason: str = ""


def verdict(check: Check, reading: Reading) -> Row:
    """Judge one reading against its check's tolerance."""
    def row(measured: float | None, error: float | None, judged: str, reason: str) -> Row:
        return Row(check=check.name, instruments=check.instruments, unit=check.unit, planted=reading.planted,
                   measured=measured, error=error, tolerance=check.tolerance, absolute=check.absolute,
                   verdict=judged, reason=reason)

    if isinstance(reading.measured, Unavailable):
        return row(None, None, "not run", reading.measured.reason)
    measured = float(reading.measured)
    diff = abs(measured - reading.planted)
    if check.absolute:
        error = diff
    elif reading.planted == 0:
        error = 0.0 if diff == 0 else math.inf
    else:
        error = diff / abs(reading.planted)
    ok = error <= check.tolerance if check.tolerance else diff == 0
    return row(measured, error, "pass" if ok else "fail", reading.detail)


def calibrated_instruments(checks: Iterable[Check]) -> frozenset[str]:
    """Every instrument some check calibrates."""
    return frozenset(key for check in checks for key in check.instruments)

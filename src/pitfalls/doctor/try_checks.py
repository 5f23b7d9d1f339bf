"""Known answers for `pitfalls doctor --try`: a loader-bound planted script (`planted/loader.py`) tried with workers,
its speedup read against the loader family's own samples/s of the same plant, measured in the same row
(docs/doctor.md, "Calibrated").
"""

from __future__ import annotations

import math
from functools import partial

from pitfalls.doctor import planted
from pitfalls.doctor.options import DoctorOptions
from pitfalls.doctor.run import run_doctor
from pitfalls.doctor.try_settings import DIGESTS, Tried, TryRow, try_settings
from pitfalls.families.loader import probes, timing_checks
from pitfalls.known.one_run import OneRun
from pitfalls.known.other_work import Conditions, on_free_cores
from pitfalls.known.table import Check, Reading

__all__ = ["BATCH", "ITEM_MS", "LOADER_SCRIPT", "SETTING", "STEP_MS", "TOLERANCE", "WORKERS", "family_speedup",
           "loader_args", "try_checks", "try_planted"]

LOADER_SCRIPT = planted.LOADER
BATCH = timing_checks.BATCH
ITEM_MS = 10.0
STEP_MS = 10.0
WORKERS = 2
SETTING: dict[str, int | bool] = {"num_workers": WORKERS, "persistent_workers": True}
# The bar: the trial and the family's routine time different programs of the same plant (the script's
# step runs a model besides its sleep), on two shared cores.
TOLERANCE = 0.15
TRY_SPEEDUP = "doctor: --try speedup"
TRY_BATCHES = "doctor: --try same batches"
TRY_WAIT = "doctor: --try wait share"


def loader_args(augment: bool = False) -> list[str]:
    """The planted script's arguments."""
    return ["--item-ms", str(ITEM_MS), "--step-ms", str(STEP_MS), "--batch", str(BATCH),
            *(["--augment"] if augment else [])]


def try_planted(augment: bool = False) -> Tried:
    """The planted script under the doctor, then tried with `SETTING` (the script's own setting beside it)."""
    options = DoctorOptions(digests=DIGESTS)
    report = run_doctor(LOADER_SCRIPT, loader_args(augment), options)
    return try_settings(report, options, [SETTING])


def family_speedup() -> float:
    """The loader family's samples/s of the same plant with `WORKERS` workers over that without."""
    rates = []
    for workers in (0, WORKERS):
        step = timing_checks.planted_step(workers, ITEM_MS, STEP_MS)
        try:
            rates.append(probes.samples_per_second(step))
        finally:
            step.close()
    return rates[1] / rates[0]


def _alone() -> tuple[tuple[Tried, float], Conditions]:
    """The trial and the family's reading, once a core per process is free; and what ran beside them."""
    return on_free_cores(lambda: (try_planted(), family_speedup()), WORKERS + 1)


_RUN: OneRun[tuple[tuple[Tried, float], Conditions]] = OneRun(_alone)
_AUGMENTED: OneRun[Tried] = OneRun(partial(try_planted, True))


def _with_workers(tried: Tried) -> TryRow | None:
    return next((row for row in tried.rows if row.workers == WORKERS and row.setting != "as written"), None)


def _same(row: TryRow | None) -> float:
    return math.nan if row is None or row.same_batches is None else float(row.same_batches)


def _speedup(_device: str) -> Reading:
    (tried, family), conditions = _RUN.take("speedup")
    row = _with_workers(tried)
    measured = row.speedup if row is not None and row.speedup is not None else math.nan
    return Reading(family, measured, f"W={WORKERS} over W=0, {ITEM_MS:g} ms per item, batch {BATCH}, step "
                                     f"{STEP_MS:g} ms; {tried.steps[1]} timed steps a trial; {conditions.note()}")


def _wait_drops(_device: str) -> Reading:
    (tried, _family), conditions = _RUN.take("wait")
    own, row = tried.rows[0], _with_workers(tried)
    dropped = row is not None and None not in (own.wait_share, row.wait_share) and \
        (row.wait_share or 0.0) < (own.wait_share or 0.0)
    shares = "; ".join(f"{r.setting}: {r.wait_share if r.wait_share is None else f'{r.wait_share:.0%}'}"
                       for r in tried.rows)
    return Reading(1.0, float(dropped), f"wait share {shares}; {conditions.note()}")


def _same_batches(_device: str) -> Reading:
    (tried, _family), _conditions = _RUN.take("same batches")
    return Reading(1.0, _same(_with_workers(tried)), tried.note or f"the first {DIGESTS} batches' digests")


def _augmented(_device: str) -> Reading:
    tried = _AUGMENTED.take("augmented")
    return Reading(0.0, _same(_with_workers(tried)), tried.note or "noise from each worker's own seed")


def try_checks() -> tuple[Check, ...]:
    """The rows of `--try loader` (CPU; not published)."""
    row = partial(Check, published=False)
    return (
        row(f"doctor --try: speedup with {WORKERS} workers, against the loader family's samples/s", (TRY_SPEEDUP,),
            "x", TOLERANCE, _speedup, why="the same plant timed by the trial and by the family's routine"),
        row(f"doctor --try: the wait drops with {WORKERS} workers", (TRY_WAIT,), "yes", 0.0, _wait_drops,
            absolute=True, why="two workers each make a batch while the step runs"),
        row(f"doctor --try: the batches with {WORKERS} workers are the script's", (TRY_BATCHES,), "yes", 0.0,
            _same_batches, absolute=True,
            why="the sampler draws from the main process's generator, with or without workers"),
        row("doctor --try: an augmentation from each worker's seed changes the batches", (TRY_BATCHES,), "yes", 0.0,
            _augmented, absolute=True, why="torch.rand in a worker draws from that worker's seed"),
    )

"""Known answers for the loader's start figures: a planted cost of starting a worker, read as a difference.

The planted data set sleeps ``d`` ms at the first item each process reads and returns the others at once (tiny
uint8 items). A process knows it has read by its pid, so a worker forked from a parent that has read (or not)
still sleeps at its own first item, and a persistent worker, which keeps its pid, sleeps only once. With W = 2
workers, batches of 4 and 8 items (an epoch is one batch per worker), through the published figures' routines:

- time to first batch (`probes.time_to_first_batch_of`): the first batch is worker 0's, whose first item sleeps:
  ``d`` more than the same plant with ``d`` = 0;
- epoch start, persistent_workers off (`epochs.epoch_starts_of`): the next epoch starts new workers, whose first
  item sleeps again: ``d`` more;
- epoch start, persistent_workers on: the same workers, which have read already: 0 more.

Each is the median of `PAIRS` differences, the planted and the bare loader read in turn, after one bare reading
thrown away (a process's first loader pays one-time costs of its own). The difference cancels what both sides
pay: forking the workers, their imports, the queues, the copy to the device.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable

import torch

from pitfalls.families.loader import check_data, epochs, probes
from pitfalls.families.loader.epochs import EpochStarts
from pitfalls.families.loader.steps import LoaderStep
from pitfalls.known.one_run import OneRun
from pitfalls.known.table import Check, Reading
from pitfalls.result import Unavailable

__all__ = ["CHECKS", "DELAY_MS", "GROWTH_TOLERANCE", "PAIRS", "STILL_TOLERANCE_MS", "WORKERS", "EpochRun",
           "FirstReadSleeps", "first_batch", "growth_reading", "paired_growth", "planted_step", "start_checks"]

WORKERS = 2
BATCH = 4
ITEMS = 8
PIXELS = 8
# The planted start cost, large against what starting two workers varies by on 2 shared cores. At load 4-5 a bare
# loader's first batch took 80-360 ms and one pair's difference varied by 40-55 ms (sd); the median of 5 pairs by
# about 20 ms, and it read 10-20 ms short of the plant (work the bare loader's first batch competes with for a core
# is done while the planted worker sleeps), whatever the plant. At 300 ms the medians of 5 pairs read -21 to +16 %;
# at 600 ms, over 36 of them (26 sliding windows of 5 over 30 pairs at load 4-5, and 10 runs of the rows beside a
# busy loop at load 3-4): time to first batch -7 to +8 %, epoch start with new workers -11 to +7 %.
DELAY_MS = 600.0
PAIRS = 5
# Relative, for the two rows that read +DELAY_MS; absolute (ms), for the one that reads +0: its medians of 5 pairs
# read -9 to +10 ms over the same runs (one pair: -39 to +37 ms).
GROWTH_TOLERANCE = 0.15
STILL_TOLERANCE_MS = 25.0

FirstBatchRoutine = Callable[[LoaderStep], float]
EpochRoutine = Callable[[LoaderStep], EpochStarts]


class FirstReadSleeps(check_data.Items):
    """A planted start cost: the first item each process reads sleeps ``delay_s``; every item is a tiny uint8 image
    and mask.

    The flag is the pid of the process that has read: a forked worker inherits the attribute but not the pid, so
    it sleeps at its own first item whatever its parent did.
    """

    size = PIXELS

    def __init__(self, items: int, delay_s: float) -> None:
        super().__init__(items)
        self.delay_s = delay_s
        self.read_in = 0

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.read_in != os.getpid():
            self.read_in = os.getpid()
            time.sleep(self.delay_s)
        return super().__getitem__(index)


def planted_step(delay_ms: float, device: str = "cpu") -> LoaderStep:
    """A not yet started ``uint8`` loader step of `FirstReadSleeps`, W workers (more than cores allowed: the cost
    is a sleep), pinning off."""
    return check_data.step(FirstReadSleeps(ITEMS, delay_ms / 1000), device, start=False, image_size=PIXELS,
                        batch=BATCH, num_workers=WORKERS, pin_memory=False)


def _read(read: Callable[[LoaderStep], tuple[float, ...]], delay_ms: float, device: str) -> tuple[float, ...]:
    with planted_step(delay_ms, device) as step:
        return read(step)


def paired_growth(read: Callable[[LoaderStep], tuple[float, ...]], device: str) -> list[tuple[float, ...]]:
    """Read the planted loader (``DELAY_MS``) and the bare one (0 ms) in turn, `PAIRS` times, after one bare
    reading thrown away.

    Args:
        read: the figures of one fresh, not yet started step, seconds.
        device: where batches are delivered.

    Returns:
        Per pair, how much longer each figure read with the plant, ms.
    """
    _read(read, 0.0, device)
    grown = []
    for _ in range(PAIRS):
        with_plant, bare = _read(read, DELAY_MS, device), _read(read, 0.0, device)
        grown.append(tuple((p - b) * 1e3 for p, b in zip(with_plant, bare, strict=True)))
    return grown


def growth_reading(planted_ms: float, grown: list[tuple[float, ...]], figure: int, setting: str) -> Reading:
    """The median difference of one figure over the pairs against its plant, each pair's in the detail."""
    values = [pair[figure] for pair in grown]
    return Reading(planted_ms, statistics.median(values), f"{setting}, median of {len(values)} pairs "
                   f"(ms more: {', '.join(f'{value:.0f}' for value in values)})")


def first_batch(device: str, first: FirstBatchRoutine = probes.time_to_first_batch_of) -> Reading:
    """Time to first batch, read by ``first`` (the published figure's routine): ``DELAY_MS`` more with the plant."""
    return growth_reading(DELAY_MS, paired_growth(lambda step: (first(step),), device), 0, f"W={WORKERS}")


class EpochRun:
    """The planted and bare loaders' epoch starts, read in pairs by ``starts`` (`epochs.epoch_starts_of`, or a
    faulty routine in a test), shared by the two rows."""

    def __init__(self, starts: EpochRoutine = epochs.epoch_starts_of) -> None:
        self.starts = starts
        self.run: OneRun[list[tuple[float, ...]]] = OneRun(self._measure)

    def _both(self, step: LoaderStep) -> tuple[float, float]:
        got = self.starts(step)
        if isinstance(got.persistent, Unavailable):
            raise ValueError(f"the planted loader has {WORKERS} workers: {got.persistent.reason}")
        return got.fresh, got.persistent

    def _measure(self, device: str) -> list[tuple[float, ...]]:
        return paired_growth(self._both, device)

    def _reading(self, row: str, figure: int, planted_ms: float, device: str) -> Reading:
        return growth_reading(planted_ms, self.run.take(row, device), figure,
                              f"W={WORKERS}, an epoch of one batch per worker")

    def fresh(self, device: str) -> Reading:
        """persistent_workers off: new workers, ``DELAY_MS`` more."""
        return self._reading("fresh", 0, DELAY_MS, device)

    def persistent(self, device: str) -> Reading:
        """persistent_workers on: the same workers, 0 more."""
        return self._reading("persistent", 1, 0.0, device)


def start_checks(run: EpochRun | None = None) -> tuple[Check, ...]:
    """The three start rows; the two epoch rows read one run of pairs (``run``; the suite's own by default)."""
    run = run or EpochRun()
    spread = "medians of 5 pairs read -11 to +8 % of 600 ms at load 3-5 on 2 shared cores (36 runs)"
    still = "medians of 5 pairs read -9 to +10 ms at load 3-5 on 2 shared cores (36 runs)"
    return (
        check_data.row(f"loader: time to first batch, +{DELAY_MS:g} ms worker start", probes.TIME_TO_FIRST_BATCH, "ms",
                    GROWTH_TOLERANCE, first_batch, spread),
        check_data.row(f"loader: epoch start, persistent off, +{DELAY_MS:g} ms worker start", probes.EPOCH_START_FRESH,
                    "ms", GROWTH_TOLERANCE, run.fresh, spread),
        check_data.row(f"loader: epoch start, persistent on, +{DELAY_MS:g} ms worker start",
                    probes.EPOCH_START_PERSISTENT, "ms", STILL_TOLERANCE_MS, run.persistent, still, absolute=True),
    )


CHECKS = start_checks()

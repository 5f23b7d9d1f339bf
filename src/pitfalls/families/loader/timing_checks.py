"""The loader's calibration rows: known-answer producers and consumers through the loader's own code path.

A planted producer is a data set whose items each sleep ``p`` ms (sleep, so that two shared cores do not decide
the answer) and a planted consumer a step that sleeps ``m`` ms per batch (`BatchStep`'s ``consume``). Both run in
a `LoaderStep` (DataLoader, its workers, the endless sampler, the copy to the device) and are timed by the same
routines the published figures use: `probes.samples_per_second` and `steady.block` through
`pitfalls.probes.blocked_speedup`. The known answers:

- samples/s at steady state is the rate the slower side allows: ``B / (B p + m)`` without workers (one process
  does both in turn), else ``B min(W / (B p), 1 / m)`` for a batch of ``B`` items and ``W`` workers;
- a producer of ``2p`` against one of ``p`` (producer-bound) reads a speedup of 2.0;
- ``naive`` against itself reads 1.00, with and without workers;
- the share of each batch spent waiting in ``next()`` (the verdict's figure, `verdict.judge` of a `steady.run`)
  is ``B p / (B p + m)`` without workers (loading and the step take turns) and ``(B p / W - m) / (B p / W)`` with
  W workers when the producer is the slower side (the step waits for the rest of each period);
- the step cost below which the loader starves the device (the verdict's crossover, from the same run) is
  ``B p (1 - t) / t`` without workers (the wait is the loading, whatever the step) and ``(1 - t) B p / W`` with W
  workers, producer-bound (the workers' pace), for the verdict's threshold ``t``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from torch import Tensor

from pitfalls.families.loader import check_data, probes, steady, verdict
from pitfalls.families.loader.entry import ENTRY, NAME
from pitfalls.families.loader.steps import BatchStep, make_step
from pitfalls.known.one_run import OneRun
from pitfalls.known.other_work import Conditions, on_free_cores
from pitfalls.known.table import SPEEDUP, Check, Reading, own_instrument
from pitfalls.probes.timing import BLOCKED_SECONDS, blocked_speedup
from pitfalls.result import Unavailable

SAMPLES_PER_SECOND = own_instrument(NAME, probes.SAMPLES_PER_SECOND)
WAIT_SHARE = own_instrument(NAME, probes.WAIT_SHARE)
STARVES_BELOW = own_instrument(NAME, verdict.STARVES_BELOW)
BATCH = 4
ITEMS = 64
PIXELS = 8
# The consumer's planted step: long against the per-batch cost of the loader itself (a queue get, a copy of a
# few bytes, a tiny normalize, the wake-up after a sleep: 3-5 ms per batch at load 2-4 on 2 shared cores, which
# read 14-20 % low against a 20 ms step), so that cost stays inside the tolerance.
STEP_MS = 50.0
WORKERS = (0, 1, 2, 4)
# Workers of the known speedup's producers.
KNOWN_WORKERS = 2
SPEEDUP_BLOCKS = 5
PAIRS = f"block pairs: {SPEEDUP_BLOCKS} at least, more within {BLOCKED_SECONDS:g} s"

Timing = Callable[[BatchStep], float]
Comparing = Callable[[BatchStep, BatchStep], float]


class SleepingItems(check_data.Items):
    """A planted producer: each item sleeps ``per_item_s`` and is a tiny uint8 image and mask."""

    size = PIXELS

    def __init__(self, items: int, per_item_s: float) -> None:
        super().__init__(items)
        self.per_item_s = per_item_s

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        time.sleep(self.per_item_s)
        return super().__getitem__(index)


@dataclass(frozen=True)
class SleepingStep:
    """A planted consumer: sleeps ``seconds`` per batch, whatever the batch."""

    seconds: float

    def __call__(self, images: Tensor, masks: Tensor) -> tuple[Tensor, Tensor]:
        time.sleep(self.seconds)
        return images, masks


def planted_step(workers: int, per_item_ms: float, step_ms: float, device: str = "cpu") -> BatchStep:
    """A loader step of `SleepingItems` and `SleepingStep` with ``workers`` workers (more than cores allowed:
    the workers sleep)."""
    return check_data.step(SleepingItems(ITEMS, per_item_ms / 1000), device, consume=SleepingStep(step_ms / 1000),
                        image_size=PIXELS, batch=BATCH, num_workers=workers)


def planted_rate(workers: int, per_item_ms: float, step_ms: float) -> float:
    """Samples/s the slower side allows (see the module's docstring)."""
    if workers == 0:
        return BATCH / ((BATCH * per_item_ms + step_ms) / 1000)
    return BATCH * min(workers / (BATCH * per_item_ms / 1000), 1000 / step_ms)


def per_item_ms(workers: int, side: str) -> float:
    """A per-item cost on one side of the crossover: the producer's batch takes twice the consumer's step
    (``side="producer"``), or half of it (``"consumer"``), per worker."""
    factor = 2.0 if side == "producer" else 0.5
    return factor * STEP_MS * max(workers, 1) / BATCH


def throughput(workers: int, side: str, device: str, timing: Timing = probes.samples_per_second) -> Reading:
    """Samples/s of a planted producer/consumer pair, read by ``timing`` (the published figure's routine)."""
    cost = per_item_ms(workers, side)
    with planted_step(workers, cost, STEP_MS, device) as step:
        return rate_reading(workers, side, timing(step))


def rate_reading(workers: int, side: str, measured: float) -> Reading:
    """The samples/s row's reading of a planted pair (``side``-bound, ``workers`` workers) that read ``measured``."""
    cost = per_item_ms(workers, side)
    return Reading(planted_rate(workers, cost, STEP_MS), measured,
                   f"W={workers}, {cost:g} ms per item, batch {BATCH}, step {STEP_MS:g} ms")


def blocked(baseline: BatchStep, candidate: BatchStep) -> float:
    """The published speedup's routine for cases with workers: steady-state blocks, one case live at a time,
    after one block of each (as the suite's cases are warmed up before they are timed)."""
    steady.block(baseline, 1)
    steady.block(candidate, 1)
    return blocked_speedup(partial(steady.block, baseline), partial(steady.block, candidate),
                           blocks=SPEEDUP_BLOCKS).ratio


def known_speedup(device: str, compare: Comparing = blocked) -> Reading:
    """Speedup of a producer of p over one of 2p (producer-bound, `KNOWN_WORKERS` workers): 2.0."""
    workers, cost, step_ms = KNOWN_WORKERS, 10.0, 2.0
    with (planted_step(workers, 2 * cost, step_ms, device) as slow,
          planted_step(workers, cost, step_ms, device) as fast):
        measured = compare(slow, fast)
    return Reading(planted_rate(workers, cost, step_ms) / planted_rate(workers, 2 * cost, step_ms), measured,
                   f"W={workers}, {2 * cost:g} against {cost:g} ms per item, {PAIRS}")


def self_speedup(workers: int, device: str, compare: Comparing = blocked) -> Reading:
    """``naive`` against itself at smoke sizes, neither started before its first block: 1.00."""
    where, params = ENTRY.place("naive", device, {**ENTRY.smoke, "num_workers": workers})
    with (make_step("naive", where, params, check_cores=False, start=False) as first,
          make_step("naive", where, params, check_cores=False, start=False) as second):
        measured = compare(first, second)
    return Reading(1.0, measured, f"naive, W={workers}, smoke sizes, {PAIRS}")


def planted_wait_share(workers: int, per_item_ms: float, step_ms: float) -> float:
    """The share of each batch the step waits in ``next()`` (see the module's docstring)."""
    load_ms = BATCH * per_item_ms
    if workers == 0:
        return load_ms / (load_ms + step_ms)
    period_ms = max(load_ms / workers, step_ms)
    return (period_ms - step_ms) / period_ms


def planted_starves_below_ms(workers: int, per_item_ms: float) -> float:
    """The step cost (ms) below which a planted producer starves the step (see the module's docstring)."""
    load_ms, threshold = BATCH * per_item_ms, verdict.WAIT_THRESHOLD
    return load_ms * (1 - threshold) / threshold if workers == 0 else (1 - threshold) * load_ms / workers


def producer_bound(workers: int, device: str, run: Callable[[BatchStep], steady.Steady] = steady.run
                   ) -> steady.Steady:
    """``run``'s steady state of a producer-bound planted pair (the producer's batch twice the step, per worker):
    the run both published figures of a case, its samples/s and its verdict, are read from."""
    with planted_step(workers, per_item_ms(workers, "producer"), STEP_MS, device) as step:
        return run(step)


def judged(workers: int, device: str, run: Callable[[BatchStep], steady.Steady] = steady.run) -> verdict.Verdict:
    """The verdict (`verdict.judge`) of `producer_bound`'s run: the published figures' routine."""
    return verdict.judge(producer_bound(workers, device, run), workers)


def alone(processes: int, measure: Callable[..., Reading], *args: Any) -> Reading:
    """Take a timed reading, ``measure(*args)``, once other work leaves a core to each of its ``processes`` (the main
    one and each worker), and say in its detail what other work it ran beside (`pitfalls.known.other_work`: the
    misses of these rows measured there came from processes running beside them, not from what ran before)."""
    return noted(*on_free_cores(partial(measure, *args), processes))


def noted(reading: Reading, conditions: Conditions) -> Reading:
    """The reading with the other work it ran beside at the end of its detail."""
    return dataclasses.replace(reading, detail=f"{reading.detail}; {conditions.note()}")


def _producer_bound_alone(workers: int, device: str) -> tuple[steady.Steady, Conditions]:
    return on_free_cores(partial(producer_bound, workers, device), workers + 1)


# The samples/s, the wait share and the crossover of one producer-bound planted pair come from one steady run, as
# a case's samples/s and verdict do (`probes.samples_per_second` and `verdict.judge` both read a `steady.run`): a
# run per row timed the same pair three times (10 s of the table's 165 here).
_PRODUCER_BOUND: OneRun[tuple[steady.Steady, Conditions]] = OneRun(_producer_bound_alone)
# The worker counts whose producer-bound pair the three rows read.
JUDGED_WORKERS = (0, 2)


def wait_share(workers: int, device: str, judge: Callable[[int, str], verdict.Verdict]) -> Reading:
    """The wait share of the producer-bound planted pair, judged by ``judge`` (the row's `_JUDGED` reader: the run
    the crossover row reads too; a test passes a faulty one)."""
    cost = per_item_ms(workers, "producer")
    return Reading(planted_wait_share(workers, cost, STEP_MS), judge(workers, device).wait_share,
                   f"W={workers}, {cost:g} ms per item, batch {BATCH}, step {STEP_MS:g} ms")


def starves_below(workers: int, device: str, judge: Callable[[int, str], verdict.Verdict]) -> Reading:
    """The step cost (ms) below which the producer-bound planted pair, judged by ``judge``, starves the step."""
    cost = per_item_ms(workers, "producer")
    measured = judge(workers, device).starves_below_s
    return Reading(planted_starves_below_ms(workers, cost),
                   measured if isinstance(measured, Unavailable) else measured * 1e3,
                   f"W={workers}, {cost:g} ms per item, batch {BATCH}, threshold {verdict.WAIT_THRESHOLD:.0%}")


def checks() -> tuple[Check, ...]:
    """Every calibration row of the loader family."""
    rows = [check_data.row(f"loader samples/s: W={workers}, {side}-bound", probes.SAMPLES_PER_SECOND, "samples/s", 0.10,
                        partial(_throughput_on, workers, side), "the issue's bar; sleeps, so the two cores do not "
                        "decide it") for workers in WORKERS for side in ("producer", "consumer")]
    rows.append(Check(f"loader speedup: producer 2p against p, W={KNOWN_WORKERS}", (SPEEDUP,), "x", 0.10,
                      partial(alone, KNOWN_WORKERS + 1, known_speedup), family=NAME,
                      why="steady-state blocks of the planted producers"))
    # Real work on 2 shared cores, 20 runs each beside a busy loop on one of them: without workers the case read
    # 0.982-1.025 (many short block pairs, see `pitfalls.probes.timing.BLOCKED_SECONDS`), the 5 %; with 2
    # workers, whose blocks are their 60 batches and a start, 0.920-1.122 (3 of 20 beyond 10 %): the workers, the
    # main process and the co-runner share 2 cores. So every timed row waits for a core per process of its own
    # (`alone`).
    for workers, tolerance in ((0, 0.05), (2, 0.10)):
        rows.append(Check(f"loader speedup: naive against itself, W={workers}", (SPEEDUP,), "x", tolerance,
                          partial(alone, workers + 1, self_speedup, workers), family=NAME,
                          why="the same case reads 1.00; spread measured here"))
    # The loader's own cost per batch (3-5 ms here, see STEP_MS) lands in the wait or the step: the planted shares
    # 0.667 (W=0) and 0.5 (W=2) read +0.2 to +1.3 % and -0.1 to +2.8 % here at load 4-11.
    for workers in JUDGED_WORKERS:
        rows.append(check_data.row(f"loader wait share: W={workers}, producer-bound", probes.WAIT_SHARE, "share", 0.10,
                                partial(_judged_on, wait_share, workers),
                                "the verdict's figure; sleeps, spread measured here"))
    # From the same runs. Without workers the crossover is the wait times (1 - t) / t = 9, so the loader's own few ms
    # per batch count nine times against the planted 100 ms of loading: read 2.1 % high here (1.6 % with W=2).
    for workers in JUDGED_WORKERS:
        rows.append(check_data.row(f"loader starves below: W={workers}, producer-bound", verdict.STARVES_BELOW, "ms",
                                0.10, partial(_judged_on, starves_below, workers),
                                "the verdict's crossover, from the wait share's run"))
    return tuple(rows)


def _judged_on(read: Callable[[int, str, Callable[[int, str], verdict.Verdict]], Reading], workers: int,
               device: str) -> Reading:
    """``read`` (`wait_share`, `starves_below`) of the verdict of the producer-bound pair's shared run."""
    run, conditions = _PRODUCER_BOUND.take(read.__name__, workers, device)
    return noted(read(workers, device, lambda *_: verdict.judge(run, workers)), conditions)


def _throughput_on(workers: int, side: str, device: str) -> Reading:
    if side == "producer" and workers in JUDGED_WORKERS:
        run, conditions = _PRODUCER_BOUND.take("samples/s", workers, device)
        return noted(rate_reading(workers, side, run.samples_per_second), conditions)
    return alone(workers + 1, throughput, workers, side, device)


CHECKS: tuple[Check, ...] = checks()

__all__ = ["CHECKS", "SleepingItems", "SleepingStep", "alone", "known_speedup", "noted", "planted_rate", "planted_step",
           "planted_starves_below_ms", "planted_wait_share", "producer_bound", "rate_reading", "self_speedup",
           "starves_below", "throughput", "judged", "wait_share"]


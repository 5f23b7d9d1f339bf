"""Steady state: what every timed loader figure measures, one case live at a time.

A loader's workers make batches ahead of the consumer: ``prefetch_factor`` per worker wait in the queue, and
each worker may hold one more while it collates. A case that sat idle (while its own figures were computed, or
while another case was timed) therefore starts with up to ``workers x (prefetch_factor + 1)`` batches ready,
which a short timing would count as free. So a steady-state run starts a fresh iterator, discards that many
batches, then times at least `TIMED_PER_PREFILLED` times as many (and at least `MIN_BATCHES`) for at least
``min_seconds``, whichever is longer, and shuts the workers down before it returns, so nothing prefetches while
another case is timed. Each timed batch is split into the wait in ``next()`` and the delivery (copy to the
device, the step, a synchronize).

`steady_state` is the one routine: the family's speedup (`Case.block`, through `pitfalls.probes.blocked_speedup`)
and samples/s run it through `run`, and ``pitfalls scan-loader`` runs it on a user's own loader and step.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from pitfalls.devices import synchronize
from pitfalls.families.loader.steps import BatchStep

__all__ = ["BLOCK_SECONDS", "MIN_BATCHES", "MIN_SECONDS", "TIMED_PER_PREFILLED", "Steady", "batches_to_time", "block",
           "prefilled", "run", "settle", "steady_state"]

# Timed batches per batch that could have been made in advance, at least.
TIMED_PER_PREFILLED = 10
# Timed batches at least, for a case with nothing made in advance (no workers, the floor).
MIN_BATCHES = 10
# Seconds timed at least by samples/s (and by any `run` not told otherwise).
MIN_SECONDS = 0.5
# Seconds timed at least by one block of a speedup: short, so that `pitfalls.probes.blocked_speedup` fits many
# adjacent pairs in its budget (see there); a block still times at least its `batches_to_time`.
BLOCK_SECONDS = 0.1


def prefilled(workers: int, prefetch_factor: int) -> int:
    """Batches a loader can hold ready before it is asked: ``prefetch_factor`` queued per worker, plus one
    per worker in collation (0 without workers)."""
    return workers * (prefetch_factor + 1) if workers else 0


def batches_to_time(workers: int, prefetch_factor: int, calls: int = 1) -> tuple[int, int]:
    """(batches to discard, batches to time at least) for a loader's workers and a caller's minimum."""
    discard = prefilled(workers, prefetch_factor)
    return discard, max(calls, TIMED_PER_PREFILLED * discard, MIN_BATCHES)


@dataclass(frozen=True)
class Steady:
    """One steady-state run.

    Attributes:
        discarded: batches taken before the clock started (the first one at least).
        batches: batches timed.
        samples: samples in them.
        seconds: wall time of the timed batches, each synchronized.
        wait_s: of which waiting in ``next()``.
        step_s: of which delivering (copy, step, synchronize).
        first_batch_s: from starting the iterator to its first batch (the epoch start, workers included).
        short: why fewer batches than the routine asks were timed (the deadline, the epoch's end), or "".
    """

    discarded: int
    batches: int
    samples: int
    seconds: float
    wait_s: float
    step_s: float
    first_batch_s: float
    short: str = ""

    @property
    def samples_per_second(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else float("nan")

    @property
    def seconds_per_batch(self) -> float:
        return self.seconds / self.batches if self.batches else float("nan")

    @property
    def wait_share(self) -> float:
        """The share of each batch's time spent waiting in ``next()``."""
        return self.wait_s / self.seconds if self.seconds > 0 else float("nan")


def steady_state(start: Callable[[], Iterator[Any]], deliver: Callable[[Any], object], samples_of: Callable[[Any], int],
                 *, discard: int, min_batches: int = MIN_BATCHES, min_seconds: float = MIN_SECONDS,
                 deadline: float | None = None) -> Steady:
    """Time the steady state of ``start()``'s batches delivered one by one to ``deliver``.

    Args:
        start: starts the iterator (workers start here); timed to its first batch.
        deliver: copies one batch to the device and runs the step, synchronized.
        samples_of: the samples in a batch.
        discard: batches to take untimed first (`prefilled`); at least the first batch is.
        min_batches: timed batches, at least; raised to `TIMED_PER_PREFILLED` x ``discard``.
        min_seconds: timed seconds, at least.
        deadline: a ``time.perf_counter()`` after which timing stops, short.

    Returns:
        The `Steady` run. The caller closes the iterator (``start`` may hand it over through a closure).
    """
    began = time.perf_counter()
    iterator = start()
    wanted = max(min_batches, TIMED_PER_PREFILLED * discard)
    first_s = 0.0
    for index in range(max(discard, 1)):
        try:
            batch = next(iterator)
        except StopIteration:
            return Steady(index, 0, 0, 0.0, 0.0, 0.0, first_s, "the epoch ended before the steady state")
        if index == 0:
            first_s = time.perf_counter() - began
        deliver(batch)
    batches = samples = 0
    wait = step = 0.0
    short = ""
    clock = time.perf_counter()
    while batches < wanted or time.perf_counter() - clock < min_seconds:
        if deadline is not None and time.perf_counter() > deadline:
            short = f"the budget ran out after {batches} of {wanted} batches"
            break
        taken = time.perf_counter()
        try:
            batch = next(iterator)
        except StopIteration:
            short = f"the epoch ended after {batches} of {wanted} batches"
            break
        got = time.perf_counter()
        deliver(batch)
        done = time.perf_counter()
        wait, step = wait + got - taken, step + done - got
        batches, samples = batches + 1, samples + samples_of(batch)
    return Steady(max(discard, 1), batches, samples, time.perf_counter() - clock if batches else 0.0, wait, step,
                  first_s, short)


class _Batches:
    """A case's host batches as an iterator (``next_batch``, its worker guard around each), for `steady_state`."""

    def __init__(self, step: BatchStep) -> None:
        self.step = step

    def __iter__(self) -> _Batches:
        return self

    def __next__(self) -> Any:
        return self.step.guarded(self.step.next_batch)


def _delivered(step: BatchStep, batch: Any) -> None:
    step.guarded(lambda: step.deliver(batch))
    synchronize(step.device)


def settle(step: BatchStep) -> int:
    """Start a case afresh and take the batches its workers could make in advance, leaving it live, so that a
    timer that calls it next (asv's ``time_batch``) sees the steady state. Returns the batches discarded."""
    discard, _ = batches_to_time(step.prefetching_workers, int(step.params["prefetch_factor"]))
    step.pause()
    for _ in range(discard):
        step.synced()
    return discard


def run(step: BatchStep, *, calls: int = 1, min_seconds: float = MIN_SECONDS) -> Steady:
    """Time a case at steady state with `steady_state`: fresh workers, the prefilled batches discarded (the first
    batch at least), then the timed batches.

    Args:
        step: the case's batch step.
        calls: batches to time at least (the block size a caller asks for).
        min_seconds: seconds to time at least.

    Returns:
        The run; the step's workers are shut down (its next call starts afresh).
    """
    discard, minimum = batches_to_time(step.prefetching_workers, int(step.params["prefetch_factor"]), calls)
    batch = int(step.params["batch"])
    step.pause()  # an iterator left from before holds batches made while the case was idle
    try:
        return steady_state(lambda: _Batches(step), lambda b: _delivered(step, b), lambda _: batch,
                            discard=discard, min_batches=minimum, min_seconds=min_seconds)
    finally:
        step.pause()


def block(step: BatchStep, calls: int) -> float:
    """`Case.block` of a loader case: seconds per batch of a steady-state `run` of at least ``calls`` batches and
    `BLOCK_SECONDS`."""
    return run(step, calls=calls, min_seconds=BLOCK_SECONDS).seconds_per_batch

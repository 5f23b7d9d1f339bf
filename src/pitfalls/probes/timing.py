"""Time a callable: host wall time (torch.utils.benchmark), CUDA-event time, and interleaved speedup.

Warm-up calls always run before anything is timed, so first-call costs (lazy CUDA init, cuDNN autotuning,
torch.compile) never enter a steady-state figure; measure those separately (see `compiled.py`).
"""

from __future__ import annotations

import statistics
import time
import timeit
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from pitfalls._checks import check_callable, check_int_at_least
from pitfalls.probes._cuda import warmed_cuda
from pitfalls.result import Unavailable

__all__ = [
    "CudaEventTiming",
    "Speedup",
    "WallTiming",
    "blocked_speedup",
    "case_speedup",
    "cuda_event_time",
    "interleaved_speedup",
    "no_sync",
    "timed_call",
    "wall_time",
]


@dataclass(frozen=True)
class WallTiming:
    """Host wall time per call, from `torch.utils.benchmark.Timer.blocked_autorange`.

    Attributes:
        median_s: median seconds per call.
        iqr_s: interquartile range of the per-block times, seconds per call.
        blocks: how many timed blocks were measured.
        calls_per_block: calls in each block (chosen by the Timer).
        num_threads: torch intra-op threads during the measurement.
    """

    median_s: float
    iqr_s: float
    blocks: int
    calls_per_block: int
    num_threads: int


def wall_time(fn: Callable[[], object], *, warmup: int = 1, min_run_time: float = 0.2,
              clock: Callable[[], float] | None = None) -> WallTiming:
    """Measure host wall time per call of `fn()` with `torch.utils.benchmark.Timer`.

    The Timer synchronizes any present accelerator at each clock reading, so time spent on the GPU is included.
    It runs with the process's current torch thread count (the Timer's default of one thread would time a
    different program on the CPU).

    Args:
        fn: a zero-argument callable; one call is one unit of work.
        warmup: untimed calls made first (>= 0).
        min_run_time: seconds to spend measuring (> 0).
        clock: the Timer's clock (default: its own, `timeit.default_timer`).

    Returns:
        A `WallTiming`.
    """
    check_callable("fn", fn)
    check_int_at_least("warmup", warmup, 0)
    if isinstance(min_run_time, bool) or not isinstance(min_run_time, (int, float)) or min_run_time <= 0:
        raise ValueError(f"min_run_time must be a number of seconds > 0, got {min_run_time!r}")
    for _ in range(warmup):
        fn()
    # Imported here, where a timing runs: torch.utils.benchmark imports torch.utils.cpp_extension, which on a CUDA
    # build with a toolkit found (nvcc on PATH, CUDA_HOME) queries the CUDA runtime and logs to stderr at import.
    # At the suite's import that would initialise CUDA in asv's forkserver before it forks every benchmark.
    from torch.utils.benchmark import Timer

    threads = torch.get_num_threads()
    timer = Timer(stmt="fn()", globals={"fn": fn}, num_threads=threads, timer=clock or timeit.default_timer)
    m = timer.blocked_autorange(min_run_time=float(min_run_time))
    return WallTiming(
        median_s=m.median,
        iqr_s=m.iqr,
        blocks=len(m.raw_times),
        calls_per_block=m.number_per_run,
        num_threads=threads,
    )


@dataclass(frozen=True)
class CudaEventTiming:
    """Device time per call measured between CUDA events.

    Attributes:
        median_ms: median milliseconds per call.
        times_ms: each call's milliseconds, in order.
    """

    median_ms: float
    times_ms: tuple[float, ...]


def cuda_event_time(
    fn: Callable[[], object],
    *,
    calls: int = 10,
    warmup: int = 1,
    cuda: Any = None,
) -> CudaEventTiming | Unavailable:
    """Time each call of `fn()` with a pair of CUDA events on the current stream.

    Events measure device time between the two records: host-side gaps between kernels count, work on other
    streams does not.

    Args:
        fn: a zero-argument callable that launches CUDA work.
        calls: timed calls (>= 1).
        warmup: untimed calls first (>= 0).
        cuda: the `torch.cuda`-like module (needs `Event(enable_timing=True)` and `synchronize()`); tests pass a
            fake. None means torch.cuda after checking CUDA can be used.

    Returns:
        A `CudaEventTiming`, or `Unavailable` with the reason ("no CUDA device", "no CUDA device: torch built
        without CUDA").
    """
    cuda = warmed_cuda(fn, calls, warmup, cuda)
    if isinstance(cuda, Unavailable):
        return cuda
    pairs = []
    for _ in range(calls):
        start, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        pairs.append((start, end))
    # One sync at the end: syncing per call would add host gaps the events would then measure.
    cuda.synchronize()
    times = tuple(float(s.elapsed_time(e)) for s, e in pairs)
    return CudaEventTiming(median_ms=statistics.median(times), times_ms=times)


@dataclass(frozen=True)
class Speedup:
    """The result of timing a baseline and a candidate interleaved.

    Attributes:
        ratio: median of the per-round ratios baseline_time / candidate_time; > 1 means the candidate is faster.
        ratios: each round's ratio, in order.
        baseline_median_s: median baseline seconds per call.
        candidate_median_s: median candidate seconds per call.
        rounds: rounds timed.
    """

    ratio: float
    ratios: tuple[float, ...]
    baseline_median_s: float
    candidate_median_s: float
    rounds: int


def no_sync() -> None:
    """Wait for nothing: the `sync` of a timing whose work is all on the host."""


def timed_call(fn: Callable[..., object], *args: object, sync: Callable[[], object],
               clock: Callable[[], float]) -> float:
    """Seconds of one call ``fn(*args)``, with ``sync()`` before each clock reading so device work is inside."""
    sync()
    start = clock()
    fn(*args)
    sync()
    return clock() - start


def interleaved_speedup(
    baseline: Callable[[], object],
    candidate: Callable[[], object],
    *,
    rounds: int = 10,
    warmup: int = 1,
    clock: Callable[[], float] = time.perf_counter,
    sync: Callable[[], object] = no_sync,
) -> Speedup:
    """Time baseline and candidate alternately (A B A B ...) in one process and compare them round by round.

    Interleaving exposes both to the same machine drift (clock boost, thermal state, noisy neighbours), and the
    median of per-round ratios ignores the odd disturbed round.

    Args:
        baseline: zero-argument callable, the reference (e.g. the naive variant).
        candidate: zero-argument callable to compare against it.
        rounds: timed rounds (>= 1); each times one call of each.
        warmup: untimed rounds first (>= 0).
        clock: seconds as a float; inject a fake in tests.
        sync: called before each clock reading, e.g. a CUDA synchronize, so device work is inside the timing.

    Returns:
        A `Speedup`.
    """
    check_callable("baseline", baseline)
    check_callable("candidate", candidate)
    check_callable("clock", clock)
    check_callable("sync", sync)
    check_int_at_least("rounds", rounds, 1)
    check_int_at_least("warmup", warmup, 0)
    for _ in range(warmup):
        baseline()
        candidate()

    pairs = []
    for i in range(rounds):
        b = timed_call(baseline, sync=sync, clock=clock)
        c = timed_call(candidate, sync=sync, clock=clock)
        if b <= 0 or c <= 0:
            raise ValueError(
                f"clock reported a non-positive duration in round {i} (baseline {b!r} s, candidate {c!r} s); "
                "the clock is too coarse or not monotonic"
            )
        pairs.append((b, c))
    return _median_speedup(pairs)


def _median_speedup(pairs: list[tuple[float, float]]) -> Speedup:
    """The `Speedup` of (baseline, candidate) times taken in pairs: the median of the per-pair ratios."""
    return Speedup(
        ratio=statistics.median(b / c for b, c in pairs),
        ratios=tuple(b / c for b, c in pairs),
        baseline_median_s=statistics.median(b for b, _ in pairs),
        candidate_median_s=statistics.median(c for _, c in pairs),
        rounds=len(pairs),
    )


# Seconds a blocked speedup keeps timing pairs after its first ``blocks``, and the most pairs it times. Load on a
# shared machine comes in bursts of a second or more: many short adjacent pairs see the same load, and their median
# holds where a few long pairs do not. Measured here with `naive` against itself without workers, six medians each,
# with a busy loop on one of the two cores: 5 pairs of 0.5 s read 0.963-1.089, 25 pairs of 0.1 s 0.986-1.004.
BLOCKED_SECONDS = 5.0
MAX_BLOCKS = 50


def blocked_speedup(
    baseline: Callable[[int], float],
    candidate: Callable[[int], float],
    *,
    blocks: int = 5,
    calls: int = 1,
    seconds: float = BLOCKED_SECONDS,
    max_blocks: int = MAX_BLOCKS,
    clock: Callable[[], float] = time.perf_counter,
) -> Speedup:
    """Compare two cases by steady-state blocks, one case at a time: A B A B ... of ``calls`` calls each.

    For cases with worker processes, queues or ranks (`pitfalls.Case.block`): each block starts the case,
    discards what it made in advance, times ``calls`` calls and leaves nothing prefetching, so the case not being
    timed cannot fill its queue at the other's expense. The ratio is the median of per-block-pair ratios.

    Args:
        baseline: ``baseline(calls) -> seconds per call`` at steady state.
        candidate: the same for the case compared with it.
        blocks: block pairs timed at least (>= 1).
        calls: calls per block (>= 1).
        seconds: after ``blocks`` pairs, more pairs are timed until this many seconds have passed since the first
            (short blocks give many pairs, long ones ``blocks``).
        max_blocks: block pairs timed at most (>= ``blocks``).
        clock: seconds as a float, for the budget; inject a fake in tests.

    Returns:
        A `Speedup` whose ``rounds`` are block pairs.
    """
    check_callable("baseline", baseline)
    check_callable("candidate", candidate)
    check_callable("clock", clock)
    check_int_at_least("blocks", blocks, 1)
    check_int_at_least("calls", calls, 1)
    check_int_at_least("max_blocks", max_blocks, blocks)
    if not seconds >= 0:
        raise ValueError(f"seconds={seconds!r} is not allowed; allowed: a number of seconds >= 0")
    pairs: list[tuple[float, float]] = []
    began = clock()
    while len(pairs) < blocks or (len(pairs) < max_blocks and clock() - began < seconds):
        b, c = baseline(calls), candidate(calls)
        if b <= 0 or c <= 0:
            raise ValueError(f"block {len(pairs)} reported a non-positive time per call (baseline {b!r} s, "
                             f"candidate {c!r} s)")
        pairs.append((b, c))
    return _median_speedup(pairs)


def case_speedup(
    baseline: Callable[[], object],
    candidate: Callable[[], object],
    *,
    rounds: int = 10,
    blocks: int = 5,
    calls: int = 1,
    seconds: float = BLOCKED_SECONDS,
    sync: Callable[[], object] = no_sync,
) -> Speedup:
    """Speedup of one case over another by the suite's one routine, for asv and ``pitfalls probe`` alike.

    Cases with workers, queues or ranks (both with a ``block``, `pitfalls.Case.block`) are compared by
    `blocked_speedup`, one case live at a time: interleaving single calls would let the idle case's workers fill
    its queue while the other is timed. Other cases are compared call by call (`interleaved_speedup`).

    Args:
        baseline: the reference case (a `pitfalls.Case`, or any callable).
        candidate: the case compared with it.
        rounds: interleaved rounds (cases without a block).
        blocks: block pairs at least (cases with a block).
        calls: calls per block.
        seconds: blocks are timed until this many seconds have passed, past the first ``blocks`` (cases with a
            block; `blocked_speedup`).
        sync: waits for the device before each clock reading (interleaved rounds).

    Returns:
        A `Speedup`.
    """
    baseline_block, candidate_block = getattr(baseline, "block", None), getattr(candidate, "block", None)
    if baseline_block is not None and candidate_block is not None:
        return blocked_speedup(baseline_block, candidate_block, blocks=blocks, calls=calls, seconds=seconds)
    return interleaved_speedup(baseline, candidate, rounds=rounds, warmup=1, sync=sync)

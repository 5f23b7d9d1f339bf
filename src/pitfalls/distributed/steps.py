"""The one definition of a step's time: each rank times N synchronized steps after a barrier; the step is the
slowest rank's median.

The same routine runs in a DDP rank (driven or standalone) and in the benchmark process for the one-process
variants (a world of one), so every variant's step time, speedup and throughput come from it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

from pitfalls._checks import check_int_at_least

__all__ = ["step_seconds", "time_steps"]


def time_steps(step: Callable[[], object], synchronize: Callable[[], None], steps: int, *,
               barrier: Callable[[], None] | None = None, warmup: int = 1) -> list[float]:
    """Seconds of each of ``steps`` steps of this process, each ending with a device synchronize.

    Args:
        step: one step (forward, backward, optimizer step), queued.
        synchronize: waits for the step's device work.
        steps: steps timed (>= 1).
        barrier: waits for every rank, after the warm-up, so that all ranks time the same steps.
        warmup: untimed steps first (what a previous case or command left is not timed).

    Returns:
        Seconds per step, in order.
    """
    check_int_at_least("steps", steps, 1)
    for _ in range(warmup):
        step()
    synchronize()
    if barrier is not None:
        barrier()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        synchronize()
        times.append(time.perf_counter() - start)
    return times


def step_seconds(per_rank: Sequence[Sequence[float]]) -> float:
    """The group's step time: the maximum over ranks of each rank's median (a step ends with its slowest rank).

    Args:
        per_rank: each rank's step times (`time_steps`), rank 0 first.
    """
    if not per_rank or not all(per_rank):
        raise ValueError("step_seconds needs at least one time from every rank")
    return max(statistics.median(times) for times in per_rank)

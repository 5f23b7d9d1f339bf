"""The calibration family: variants whose costs are planted, so every shared figure has a known answer.

A call of ``naive`` is 2T ms of host work and k ``.item()`` calls; one of ``half`` is T ms of work and no
``.item()``; the floor does neither. All touch ``mib`` MiB of fresh memory on the case's device and return the
same value, so time per call reads T (or 2T), the speedup 2.0, sync hazards k and 0, and the peak ``mib`` MiB. The
work is the thread's CPU time with the memory touched inside it, not a wall-clock wait (why, as measured:
docs/families/calibration.md).
"""

from __future__ import annotations

import contextlib
import ctypes
import time
from collections.abc import Iterator
from typing import Any

import torch

from pitfalls.family import FLOOR, HAZARDS, SPEEDUP, TIME, Case, Comparison, Family, Param
from pitfalls.units import MIB

NAIVE, HALF = "naive", "half"


# (planted ms, wall seconds the call really took) of every planted call, while a calibration check records (None:
# not recording).
_RECORD: list[tuple[float, float]] | None = None


def busy_wait(ms: float, since: tuple[float, float] | None = None) -> None:
    """Keep this thread computing until it has run ``ms`` milliseconds of CPU since ``since``.

    Args:
        ms: the planted work, in ms of this thread's CPU time (its wall length on an idle core).
        since: (``time.perf_counter()``, ``time.thread_time()``) read where the planted work began (the call's
            start, so that the work done before the wait counts in it); None means now.
    """
    wall, cpu = (time.perf_counter(), time.thread_time()) if since is None else since
    deadline = cpu + ms / 1e3
    while time.thread_time() < deadline:
        pass
    if _RECORD is not None:
        _RECORD.append((ms, time.perf_counter() - wall))


@contextlib.contextmanager
def recording() -> Iterator[list[tuple[float, float]]]:
    """Record (planted ms, wall seconds it really took) of every planted call inside the block, in call order.

    On a loaded 2-core machine T ms of work takes longer than T on the wall clock: the recorded durations are the
    workload's own truth, against which an instrument's reading is judged.
    """
    global _RECORD
    previous, _RECORD = _RECORD, []
    try:
        yield _RECORD
    finally:
        _RECORD = previous


def touch(mib: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Allocate ``mib`` MiB on ``device`` and write every byte of it; returns it so the caller decides when it is
    freed.

    The block lands on the case's device, so that the figure that reads that device's memory (ru_maxrss on the
    host, the CUDA caching allocator's high-water mark on a GPU) sees the planted MiB.
    """
    block = torch.empty(mib * MIB, dtype=torch.uint8, device=device)
    if block.device.type == "cpu":
        # memset runs on this thread: its CPU time is on the clock the planted work is counted on (torch's fill_
        # would spread it over an OpenMP pool, and wait there for a thread the scheduler parked).
        ctypes.memset(block.data_ptr(), 1, block.numel())
    else:
        # A device pointer is not host memory: memset on it would crash or write elsewhere. fill_ is queued on the
        # device; the allocator counted the block when it was allocated, which is what a peak reads.
        block.fill_(1)
    return block


def planted(x: torch.Tensor, ms: float, items: int, mib: int) -> torch.Tensor:
    """One call of planted cost: ``mib`` MiB touched and ``items`` `.item()` calls inside ``ms`` ms of host work
    (the busy-wait makes up the rest); returns x.sum()."""
    since = (time.perf_counter(), time.thread_time())
    if mib:
        touch(mib, x.device)  # freed at once: the peak of one call is its size
    for i in range(items):
        x[i % x.numel()].item()
    busy_wait(ms, since)
    return x.sum()


def build(variant: str, device: torch.device, compiled: bool, params: dict[str, Any]) -> Case:
    t = params["ms"]
    # (busy-wait ms, `.item()` calls) of one call of the variant.
    ms, items = {NAIVE: (2 * t, params["items"]), HALF: (t, 0), FLOOR: (0, 0)}[variant]
    x = torch.arange(8, dtype=torch.float32, device=device)

    def fn(values: torch.Tensor) -> torch.Tensor:
        return planted(values, ms, items, params["mib"])

    return Case(FAMILY.name, variant, device, compiled, params, lambda: fn(x), fn, (x,))


def same_sum(family: Family, variant: str, device: torch.device) -> Comparison:
    """Both variants return the same sum: their planted costs differ, their answer does not."""
    want = family.build(NAIVE, device=str(device), **family.smoke)()
    got = family.build(variant, device=str(device), **family.smoke)()
    error = float((got - want).abs())
    return Comparison(family.name, variant, str(device), error == 0, error, "" if error == 0 else "sums differ")


FAMILY = Family(
    name="calibration",
    article="calibration",
    summary="planted costs (busy-wait 2T vs T, k .item() vs 0, N MiB touched): known answers for every figure",
    variants=(NAIVE, HALF),
    params=(
        Param("ms", 5, "T: the half variant busy-waits T ms per call, naive 2T", minimum=0),
        Param("items", 3, "k: .item() calls per naive call (half makes none)", minimum=0),
        Param("mib", 0, "MiB each call allocates and touches", minimum=0),
    ),
    builder=build,
    estimate=lambda params: params["mib"] * MIB + 4096,
    comparer=same_sum,
    smoke={"ms": 1, "items": 3, "mib": 1},
    grids={"quick": {"ms": (5,), "items": (3,), "mib": (16,)}, "full": {"ms": (5, 50), "items": (3,), "mib": (16,)}},
    figures=frozenset({TIME, SPEEDUP, HAZARDS}),
)

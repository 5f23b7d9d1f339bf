"""Export a torch.profiler Chrome trace of a few calls, with the sync hazards labelled.

Each hazard call (see `syncs.py`) sits inside a `record_function("sync-hazard: <op>")` range and each call
inside a "pitfalls step <i>" range, so a naive and an optimized trace opened side by side in chrome://tracing or
https://ui.perfetto.dev show where the host waited. Labelling needs the hazard dispatch mode, which runs
compiled code eagerly (see `syncs.py`); pass `label_hazards=False` to trace what compiled code really does.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from pitfalls._checks import check_callable, check_int_at_least
from pitfalls.devices import synchronize
from pitfalls.probes._cuda import cuda_unavailable_reason, is_cuda_device
from pitfalls.probes.syncs import HazardCounts, SyncHazardCounter

__all__ = ["HAZARD_RANGE_PREFIX", "TraceResult", "export_trace", "hazard_ranges", "quiet_profiler_log"]

HAZARD_RANGE_PREFIX = "sync-hazard: "
# Kineto writes these lines to the process's stderr at every profiler start and stop, from C++, with no switch
# to turn them off; they say nothing a user of the trace needs.
PROFILER_NOISE = ("USDT:",)


@contextlib.contextmanager
def quiet_profiler_log() -> Iterator[None]:
    """Hold back the profiler's own log lines (written to file descriptor 2 from C++) and pass on the rest.

    Everything else written to stderr in the block is written back when it ends, in order.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            kept = [line for line in held.read().decode(errors="replace").splitlines(keepends=True)
                    if not line.startswith(PROFILER_NOISE)]
            sys.stderr.write("".join(kept))
            sys.stderr.flush()


@dataclass(frozen=True)
class TraceResult:
    """Where a trace went and what it holds.

    Attributes:
        path: the Chrome-trace JSON file written.
        steps: traced calls.
        activities: "CPU" and, where CUDA is usable, "CUDA".
        hazards: the hazards labelled in the trace, over all traced calls; None when labelling was off.
    """

    path: Path
    steps: int
    activities: tuple[str, ...]
    hazards: HazardCounts | None


def export_trace(
    fn: Callable[[], object],
    path: str | Path,
    *,
    steps: int = 3,
    warmup: int = 1,
    device: torch.device | str | None = None,
    label_hazards: bool = True,
) -> TraceResult:
    """Profile `steps` calls of `fn()` after `warmup` untraced ones and write one Chrome-trace JSON file.

    Args:
        fn: a zero-argument callable, one call per step.
        path: the JSON file to write; its folder must exist.
        steps: traced calls (>= 1).
        warmup: untraced calls first (>= 0), so one-off costs stay out of the trace.
        device: where fn's work runs; a CUDA device is synchronized after each step so its kernels land in it.
        label_hazards: wrap each sync-hazard op in a labelled range (runs compiled code eagerly, see above).

    Returns:
        A `TraceResult`.
    """
    check_callable("fn", fn)
    check_int_at_least("steps", steps, 1)
    check_int_at_least("warmup", warmup, 0)
    target = Path(path)
    if not target.parent.is_dir():
        raise ValueError(f"path={str(target)!r} is in a folder that does not exist")
    activities = [ProfilerActivity.CPU]
    if is_cuda_device(device) or (device is None and cuda_unavailable_reason() is None):
        activities.append(ProfilerActivity.CUDA)

    for _ in range(warmup):
        fn()
    synchronize(device)
    counter = SyncHazardCounter(label_ranges=True) if label_hazards else None
    with quiet_profiler_log():
        with profile(activities=activities) as prof, counter if counter is not None else contextlib.nullcontext():
            for i in range(steps):
                with record_function(f"pitfalls step {i}"):
                    fn()
                synchronize(device)
        prof.export_chrome_trace(str(target))
    return TraceResult(
        path=target,
        steps=steps,
        activities=tuple(activity.name for activity in activities),
        hazards=counter.result if counter is not None else None,
    )


def hazard_ranges(path: str | Path) -> dict[str, int]:
    """Count the labelled sync-hazard ranges in a Chrome-trace file.

    Args:
        path: a trace written by `export_trace`.

    Returns:
        A dict from hazard label (without the "sync-hazard: " prefix) to the number of ranges.
    """
    with open(path, encoding="utf-8") as f:
        trace = json.load(f)
    # Only the CPU-side range ("user_annotation"); a CUDA trace also mirrors it on the GPU timeline.
    return dict(Counter(
        event["name"].removeprefix(HAZARD_RANGE_PREFIX) for event in trace.get("traceEvents", [])
        if event.get("name", "").startswith(HAZARD_RANGE_PREFIX) and event.get("cat") == "user_annotation"
    ))

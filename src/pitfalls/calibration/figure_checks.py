"""The shared checks: known answers for the figures every family has, through the suite's own functions.

Each check builds a case of the ``calibration`` family (planted costs) and reads it with the function the asv
benchmark or ``pitfalls probe`` uses, so a fault in any of them shows as a row that misses its planted value
(docs/methodology.md).
"""

from __future__ import annotations

import contextlib
import os
import resource
import select
import signal
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from pitfalls import measure
from pitfalls.families import calibration
from pitfalls.known.table import (
    COMPILE_SECONDS,
    CUDA,
    CUDA_EVENT_TIME,
    CUDA_PEAK_MEMORY,
    CUDA_SYNCS,
    GRAPH_BREAKS,
    NVML_BUSY,
    NVML_MEMORY,
    PEAK_MEMORY,
    RECOMPILES,
    SPEEDUP,
    SYNC_HAZARDS,
    TIME_PER_CALL,
    Check,
    Reading,
)
from pitfalls.probes.compiled import CompileReport, compile_probe
from pitfalls.probes.timing import cuda_event_time, wall_time
from pitfalls.result import Unavailable
from pitfalls.units import MIB

__all__ = ["compile_seconds", "planted_backend", "planted_compile", "shared_checks"]

FAMILY = calibration.FAMILY.name
# Long enough that the last scheduling slice a loaded machine adds to a wait is a small part of it.
SELF_MS = 20
# What the planted torch.compile backend takes to compile: well above the jitter of dynamo's own tracing of a tiny
# function on a loaded 2-core machine (tens of ms), and three pairs of compiles stay within ~2 s.
COMPILE_MS = 300
COMPILE_PAIRS = 3
# Compiles made and thrown away before the pairs: a process's first compiles pay dynamo's own start-up (imports,
# caches built lazily: up to 2 s for the first, ~0.2 s more for the second), which is no backend's compile time.
COMPILE_WARMUPS = 2
# ``torch.cuda._sleep`` cycles of each timed calibration of the GPU's clock: ~25 ms at 2 GHz, so a few µs of event
# resolution and launch jitter are a small part of it; and how many are timed (their median is the clock).
CALIBRATION_CYCLES = 50_000_000
CYCLE_CALIBRATIONS = 3
# The untimed sleep first (~5 ms at 2 GHz): it loads the kernel's module and gets the SM clock out of idle.
WARMUP_CYCLES = 10_000_000


def median_reading(measure: Callable[[str], Reading], times: int = 3) -> Callable[[str], Reading]:
    """Read a timed check ``times`` times and keep the reading whose measured/planted ratio is the median: the
    protocol the tolerances were chosen for (docs/methodology.md, "The spread the tolerances were chosen from")."""

    def measure_median(device: str) -> Reading:
        readings = [measure(device) for _ in range(times)]
        ratios: list[tuple[float, Reading]] = []
        for r in readings:
            if isinstance(r.measured, Unavailable):
                return r
            ratios.append((r.measured / r.planted if r.planted else 0.0, r))
        ratios.sort(key=lambda pair: pair[0])
        kept = ratios[len(ratios) // 2][1]
        shown = ", ".join(f"{ratio:.3f}" for ratio, _ in ratios)
        return Reading(planted=kept.planted, measured=kept.measured,
                       detail=f"{kept.detail}; median of {times} readings (measured/planted {shown})")

    return measure_median


def _case(variant: str, device: str = "cpu", **sizes: Any) -> Any:
    params = {"ms": 0, "items": 0, "mib": 0, **sizes}
    return measure.case(FAMILY, variant, device, "eager", **params)


def _busy_times(ms: float) -> Callable[[str], Reading]:
    """Time per call of a T ms busy-wait: the probes' timer around ``measure.step``, against what the waits took."""

    def read(_device: str) -> Reading:
        case = _case(calibration.HALF, ms=ms)
        with calibration.recording() as record:
            timing = wall_time(lambda: measure.step(case), warmup=1, min_run_time=max(0.2, 8 * ms / 1e3))
        # The timed calls are the last blocks x calls of the record (the Timer sized its blocks first).
        timed = [seconds for _, seconds in record][-timing.blocks * timing.calls_per_block:]
        per_block = [statistics.fmean(timed[i:i + timing.calls_per_block])
                     for i in range(0, len(timed), timing.calls_per_block)]
        truth = statistics.median(per_block) * 1e3
        return Reading(planted=truth, measured=timing.median_s * 1e3,
                       detail=f"nominal {ms} ms; {timing.blocks} blocks x {timing.calls_per_block}; the waits took "
                              f"{truth:.2f} ms (median of block means)")

    return read


def _paired_truth(record: list[tuple[float, float]], slow_ms: float, fast_ms: float) -> float | Unavailable:
    """The median per-round ratio of what the waits really took, rounds paired as ``measure.speedup`` pairs them.

    The rounds are baseline, candidate, baseline, candidate ... after one warm-up pair.
    """
    pairs = list(zip(record[2::2], record[3::2], strict=False))
    if not pairs or any(a[0] != slow_ms or b[0] != fast_ms for a, b in pairs):
        return Unavailable("the waits did not alternate baseline, candidate as expected")
    return statistics.median(a[1] / b[1] for a, b in pairs)


class _Items(Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.full((4,), float(index))


@contextlib.contextmanager
def _idle_workers(workers: int) -> Iterator[None]:
    """DataLoader workers alive for the block, having prefetched everything: they only wait (none for 0)."""
    if not workers:
        yield
        return
    loader = DataLoader(_Items(), batch_size=1, num_workers=workers, prefetch_factor=2, persistent_workers=False)
    iterator = iter(loader)
    next(iterator)
    time.sleep(0.2)  # 4 items, 2 workers x 2 prefetched: every item is made; the workers now only wait
    try:
        yield
    finally:
        iterator._shutdown_workers()  # type: ignore[attr-defined]


def _speedup(slow_ms: int, fast_ms: int, nominal: float, idle_workers: int = 0) -> Callable[[str], Reading]:
    """A busy-wait of ``slow_ms`` against one of ``fast_ms``, through ``measure.speedup``, workers idle alongside."""

    def read(_device: str) -> Reading:
        with _idle_workers(idle_workers):
            slow = _case(calibration.NAIVE if slow_ms != fast_ms else calibration.HALF,
                         ms=slow_ms // 2 if slow_ms != fast_ms else slow_ms)
            fast = _case(calibration.HALF, ms=fast_ms)
            with calibration.recording() as record:
                ratio = measure.speedup(slow, fast).ratio
        truth = _paired_truth(record, slow_ms, fast_ms)
        if isinstance(truth, Unavailable):
            return Reading(planted=nominal, measured=truth)
        note = f", {idle_workers} idle DataLoader workers alive" if idle_workers else ""
        # On a loaded machine a wait ends when the process is next scheduled after its deadline: the reading is
        # judged against the waits' own ratio; the nominal ratio is in the detail.
        return Reading(planted=truth, measured=ratio,
                       detail=f"busy-wait {slow_ms} ms against {fast_ms} ms{note}; nominal {nominal:.1f}, the waits' "
                              f"own ratio {truth:.3f}")

    return read


def _peak_memory(mib: int) -> Callable[[str], Reading]:
    """Peak memory of one call as asv's ``peakmem`` reads it: the growth of ru_maxrss of a fresh forked process."""

    def read(_device: str) -> Reading:
        case, empty = _case(calibration.HALF, mib=mib), _case(calibration.HALF, mib=0)
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: one call, then report its high-water growth and leave without cleanup
            os.close(read)
            torch.set_num_threads(1)  # the parent's OpenMP pool does not survive a fork: never wake it here
            measure.step(empty)  # the same call with nothing planted: what the call costs besides the N MiB
            before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            measure.step(case)
            after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            os.write(write, f"{after - before}".encode())
            os._exit(0)
        os.close(write)
        ready, _, _ = select.select([read], [], [], 60)
        text = os.read(read, 64).decode() if ready else ""
        os.close(read)
        if not text:
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        if not text:
            return Reading(planted=mib, measured=Unavailable("the forked process reported nothing within 60 s"))
        return Reading(planted=mib, measured=int(text) / 1024, detail="ru_maxrss growth of a forked process")

    return read


def _sync_hazards(k: int) -> Callable[[str], Reading]:
    def read(_device: str) -> Reading:
        return Reading(planted=k, measured=measure.sync_hazards(_case(calibration.NAIVE, items=k)),
                       detail=f"{k} planted .item()")

    return read


def _two_breaks(x: torch.Tensor) -> torch.Tensor:
    # Straight-line code: a break inside a loop makes dynamo run the whole frame eagerly (no graph at all).
    x = x + 1
    torch._dynamo.graph_break()
    x = x * 3
    torch._dynamo.graph_break()
    return x - 2


def _graph_breaks(_device: str) -> Reading:
    report = compile_probe(_two_breaks, lambda n: (torch.ones(n),), [8], backend="eager", steady_calls=1)
    return Reading(planted=2, measured=report.graph_breaks, detail=f"{report.graphs} graphs (backend eager)")


def _recompiles(s: int) -> Callable[[str], Reading]:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return (x * 2).sum()

    def read(_device: str) -> Reading:
        sizes = [8 * (i + 1) for i in range(s + 1)]
        report = compile_probe(fn, lambda n: (torch.ones(n),), sizes, dynamic=False, backend="eager", steady_calls=1)
        return Reading(planted=s, measured=report.recompiled_graphs, detail=f"sizes {sizes}, dynamic=False")

    return read


def _tiny(x: torch.Tensor) -> torch.Tensor:
    # A few ops on a tiny tensor: one graph, no break, a steady call of microseconds.
    return (x.sin() * 2 + 1).sum()


def planted_backend(ms: float) -> Callable[[torch.fx.GraphModule, list[torch.Tensor]], Callable[..., Any]]:
    """A torch.compile backend that takes ``ms`` to compile: it computes until ``ms`` have passed on the wall clock,
    then hands dynamo's graph back to be run eagerly (it spins rather than sleeps: docs/methodology.md, "Compile
    seconds").

    Args:
        ms: the milliseconds its compile takes.

    Returns:
        The backend, ``backend(graph_module, example_inputs) -> graph_module.forward``, named ``spin_<ms>ms``.
    """

    def backend(gm: torch.fx.GraphModule, _example_inputs: list[torch.Tensor]) -> Callable[..., Any]:
        deadline = time.perf_counter() + ms / 1e3
        while time.perf_counter() < deadline:
            pass
        return gm.forward

    backend.__name__ = f"spin_{ms:g}ms"
    return backend


def compile_seconds(report: CompileReport) -> float:
    """The published figure, ``track_compile_seconds``: `CompileReport.compile_s`."""
    return report.compile_s


def _compiled_figure(ms: float, figure: Callable[[CompileReport], float]) -> float:
    """The figure of `_tiny` compiled by a backend of ``ms``, as ``measure.compile_figures`` compiles a case."""
    with measure.cold_compile_cache():
        report = compile_probe(_tiny, lambda n: (torch.ones(n),), [8], backend=planted_backend(ms))
    return figure(report)


def planted_compile(figure: Callable[[CompileReport], float] = compile_seconds) -> Callable[[str], Reading]:
    """The compile-seconds check: a backend of `COMPILE_MS` against the same backend of 0 ms, read by ``figure``, the
    median of pairs that alternate which comes first (docs/methodology.md, "Compile seconds").

    Args:
        figure: report -> seconds: the published figure's routine (`compile_seconds`); a test passes a faulty one.

    Returns:
        ``measure(device) -> Reading`` in ms.
    """

    def read(_device: str) -> Reading:
        for _ in range(COMPILE_WARMUPS):
            _compiled_figure(0, figure)
        differences = []
        for i in range(COMPILE_PAIRS):
            first, second = (_compiled_figure(m, figure) for m in ((0, COMPILE_MS) if i % 2 else (COMPILE_MS, 0)))
            differences.append(second - first if i % 2 else first - second)
        shown = ", ".join(f"{d * 1e3:.1f}" for d in differences)
        return Reading(planted=COMPILE_MS, measured=statistics.median(differences) * 1e3,
                       detail=f"backend spinning {COMPILE_MS:g} ms against 0 ms, cold caches; median of "
                              f"{COMPILE_PAIRS} pairs ({shown} ms)")

    return read


# The CUDA rows below are measured only where a CUDA device is present: `run.run_checks` reads the others as
# "not run here" before calling them.


def _cycles_per_ms() -> float:
    """The GPU's clock as ``torch.cuda._sleep`` counts it: the median of `CYCLE_CALIBRATIONS` long sleeps' cycles
    over their length, after a warm-up sleep (docs/methodology.md, "CUDA rows")."""
    torch.cuda._sleep(WARMUP_CYCLES)
    torch.cuda.synchronize()
    return statistics.median(_sleep_cycles_per_ms(CALIBRATION_CYCLES) for _ in range(CYCLE_CALIBRATIONS))


def _sleep_cycles_per_ms(cycles: int) -> float:
    """Cycles per ms of one ``_sleep(cycles)``, timed by a pair of CUDA events around it.

    Events time the kernel on the GPU, without the host's launch and wake-up latency or a host thread the
    scheduler parks before it reads its clock. They are torch's own, not `cuda_event_time`: the probe the row
    judges stays out of the planted value it is judged against.
    """
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    torch.cuda.synchronize()
    return cycles / float(start.elapsed_time(end))


def _cuda_event_time(_device: str) -> Reading:
    ms = 20.0
    cycles = int(_cycles_per_ms() * ms)
    timing = cuda_event_time(lambda: torch.cuda._sleep(cycles), warmup=1, calls=10)
    if isinstance(timing, Unavailable):
        return Reading(planted=ms, measured=timing)
    return Reading(planted=ms, measured=timing.median_ms, detail=f"torch.cuda._sleep({cycles})")


def _cuda_peak(mib: int) -> Callable[[str], Reading]:
    def read(_device: str) -> Reading:
        case = _case(calibration.HALF, device="cuda", mib=mib)
        peak = measure.cuda_peak_mib(case)
        torch.cuda.synchronize()
        return Reading(planted=mib, measured=peak - torch.cuda.memory_allocated() / MIB,
                       detail="allocator high-water mark of one call, less the case's own tensors")

    return read


def _cuda_syncs(_device: str) -> Reading:
    per_call = measure.cuda_syncs(_case(calibration.NAIVE, device="cuda", items=1))
    return Reading(planted=1, measured=per_call, detail="one planted .item() per call, sync debug mode")


class _GpuLoop:
    """What an NVML window loops: a ``torch.cuda._sleep`` of ``cycles`` (none: nothing queued), then 10 ms idle."""

    device = torch.device("cuda")

    def __init__(self, cycles: int = 0) -> None:
        self.cycles = cycles

    def __call__(self) -> None:
        if self.cycles:
            torch.cuda._sleep(self.cycles)
            torch.cuda.synchronize()
        time.sleep(0.010)


def _nvml_mean(figure: str, cycles: int = 0) -> float | Unavailable:
    """The mean of an NVML window's ``figure`` (``utilization_pct``, ``memory_used_mib``) over `_GpuLoop` calls."""
    window = measure.nvml_window(_GpuLoop(cycles), torch.device("cuda"), measure.NVML_WINDOW_S)
    if isinstance(window, Unavailable):
        return window
    value = getattr(window, figure)
    return value if isinstance(value, Unavailable) else value.mean


def _nvml_busy(_device: str) -> Reading:
    busy = _nvml_mean("utilization_pct", int(_cycles_per_ms() * 10))  # 10 ms on the GPU, then 10 ms of nothing
    # An unavailable reading is judged by its reason: the detail is read only with a figure.
    return Reading(planted=50.0, measured=busy, detail="10 ms kernel, 10 ms idle, NVML utilization")


def _nvml_memory(mib: int) -> Callable[[str], Reading]:
    def read(_device: str) -> Reading:
        torch.cuda.empty_cache()
        bare = _nvml_mean("memory_used_mib")
        # ones, not empty: the pages are the device's either way (cudaMalloc backs them), and written is the case's.
        held = torch.ones(mib * MIB, dtype=torch.uint8, device="cuda")
        holding = _nvml_mean("memory_used_mib")
        del held
        torch.cuda.empty_cache()
        if isinstance(bare, Unavailable) or isinstance(holding, Unavailable):
            return Reading(planted=mib, measured=bare if isinstance(bare, Unavailable) else holding)
        return Reading(planted=mib, measured=holding - bare,
                       detail="NVML device memory used (mean of a window) while the tensor is held, less before")

    return read


def shared_checks() -> tuple[Check, ...]:
    """Every shared check: time, speedup, peak memory, sync hazards, compile, and the CUDA rows."""
    ten = "10 % (the issue's bound for a shared 2-core machine)"
    return (
        Check("time: busy-wait 5 ms", (TIME_PER_CALL,), "ms", 0.15, median_reading(_busy_times(5)),
              why="20 runs at load 15 on 2 cores: median 1.6 %, p90 3.1 %, max 11.7 %"),
        Check("time: busy-wait 50 ms", (TIME_PER_CALL,), "ms", 0.10, _busy_times(50), why=ten),
        Check("speedup: 2T against T", (SPEEDUP,), "x", 0.10, median_reading(_speedup(20, 10, 2.0)), why=ten),
        Check("speedup: a case against itself", (SPEEDUP,), "x", 0.05, median_reading(_speedup(SELF_MS, SELF_MS, 1.0)),
              why="5 %"),
        Check("speedup: itself, idle workers alive", (SPEEDUP,), "x", 0.05,
              median_reading(_speedup(SELF_MS, SELF_MS, 1.0, idle_workers=2)), why="5 %"),
        Check("peak memory: 64 MiB in one call", (PEAK_MEMORY,), "MiB", 0.05, _peak_memory(64), why="5 %"),
        Check("sync hazards: 3 planted .item()", (SYNC_HAZARDS,), "ops", 0.0, _sync_hazards(3), why="exact"),
        Check("compile: 2 planted graph breaks", (GRAPH_BREAKS,), "breaks", 0.0, _graph_breaks, why="exact"),
        Check("compile: 3 new shapes recompile", (RECOMPILES,), "graphs", 0.0, _recompiles(3), why="exact"),
        Check(f"compile: a backend that takes {COMPILE_MS} ms", (COMPILE_SECONDS,), "ms", 0.10, planted_compile(),
              why="10 %: 24 runs at load 3.4-6.3 on 2 cores read 278-319 ms, median 301 (errors: median 2 %, max 7 %)"),
        Check("cuda: _sleep kernel by CUDA events", (CUDA_EVENT_TIME,), "ms", 0.05, _cuda_event_time, device=CUDA,
              why="5 %"),
        Check("cuda: peak memory of 64 MiB", (CUDA_PEAK_MEMORY,), "MiB", 0.0, _cuda_peak(64), device=CUDA,
              why="the allocator's own count: exact"),
        Check("cuda: one .item() is one sync", (CUDA_SYNCS,), "syncs", 0.0, _cuda_syncs, device=CUDA, why="exact"),
        Check("cuda: NVML busy half the time", (NVML_BUSY,), "%", 15.0, _nvml_busy, device=CUDA, absolute=True,
              why="15 points: NVML samples 1/6 s to 1 s periods (an H200 read 49.6, once)"),
        Check("cuda: NVML memory of 256 MiB held", (NVML_MEMORY,), "MiB", 0.02, _nvml_memory(256), device=CUDA,
              why="2 %: the driver backs an allocation in whole pages of up to 2 MiB (an H200 read 256.0, once)"),
    )

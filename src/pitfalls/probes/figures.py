"""Run every probe on one case and show the figures as a table (what `pitfalls probe` prints).

Order matters: a compiled case's first call is measured before anything else calls it, so it is the call that
compiles. Figures that do not apply or cannot be measured here are `Unavailable` with the reason.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from pitfalls._checks import check_callable
from pitfalls.devices import synchronize
from pitfalls.family import ALL_FIGURES, CUDA, HAZARDS, NVML, SPEEDUP, Case
from pitfalls.probes._cuda import cuda_unavailable_reason, is_cuda_device
from pitfalls.probes.compiled import compile_failure_reason, first_call
from pitfalls.probes.nvml import MetricSummary, NvmlSummary, nvml_unavailable_reason, nvml_windows
from pitfalls.probes.syncs import count_cuda_syncs, count_hazards
from pitfalls.probes.timing import CudaEventTiming, case_speedup, cuda_event_time, wall_time
from pitfalls.probes.trace import export_trace
from pitfalls.result import Unavailable
from pitfalls.units import MIB

if TYPE_CHECKING:
    from rich.table import Table

__all__ = ["ProbeFigure", "probe_case", "render"]

# Steady-state blocks timed for the time per call of a case with workers, queues or ranks.
TIME_BLOCKS = 5


@dataclass(frozen=True)
class ProbeFigure:
    """One measured figure of a case.

    Attributes:
        name: what it is, e.g. "time per call".
        value: the number (or text), or `Unavailable` with the reason.
        unit: e.g. "ms", "x", "ops", "%".
        note: how to read it, when that is not obvious.
    """

    name: str
    value: float | int | str | Unavailable
    unit: str
    note: str = ""


def _check_positive(name: str, value: object, kind: type) -> None:
    ok = isinstance(value, (int, float)) if kind is float else isinstance(value, int)
    if isinstance(value, bool) or not ok or value <= 0:  # type: ignore[operator]
        raise ValueError(f"{name} must be {'a number' if kind is float else 'an int'} > 0, got {value!r}")


def _not_on_cuda(case: Case) -> Unavailable:
    reason = cuda_unavailable_reason()
    return Unavailable(reason if reason is not None else f"case runs on {case.device}")


def _compile_figures(case: Case, sync: Callable[[], None]) -> list[ProbeFigure]:
    first = first_call(case, sync=sync)
    reasons = "; ".join(
        f"{b.reason} [{b.context}] x{b.count}" if b.context else f"{b.reason} x{b.count}" for b in first.breaks
    )
    return [
        ProbeFigure("first call (compile + one run)", first.seconds, "s", "from a fresh dynamo state"),
        ProbeFigure("graphs compiled", first.graphs, "graphs"),
        ProbeFigure("graph breaks", first.graph_breaks, "breaks", reasons),
    ]


def _hazard_figures(case: Case) -> list[ProbeFigure]:
    counts = count_hazards(case)
    note = "ops that would make the host wait for the device; eager program"
    if case.compiled:
        note += " (compiled code runs eagerly while counted)"
    figures = [ProbeFigure("sync hazards per call", counts.total, "ops", note)]
    figures += [ProbeFigure(f"  {label}", n, "ops") for label, n in counts.counts]
    return figures


# Each NVML figure: its name, unit and note, and the `NvmlSummary` field and statistic it reads.
_NVML_FIGURES = (
    ("GPU busy (NVML utilization, sampled)", "%", "mean; share of time any kernel ran, not SM occupancy",
     "utilization_pct", "mean"),
    ("GPU busy (NVML driver samples)", "%", "mean of the driver's own samples in the window",
     "nvml_utilization_pct", "mean"),
    ("GPU memory used (NVML)", "MiB", "max, all processes", "memory_used_mib", "max"),
    ("GPU power (NVML)", "W", "mean", "power_w", "mean"),
    ("SM clock (NVML)", "MHz", "mean", "sm_clock_mhz", "mean"),
)


def _nvml_figures(case: Case, seconds: float, nvml: Any, sync: Callable[[], None]) -> list[ProbeFigure]:
    if not is_cuda_device(case.device):
        # Say what stops NVML on this machine first: that is what a user must fix to get these figures.
        s: NvmlSummary | Unavailable = Unavailable(nvml_unavailable_reason(nvml) or f"case runs on {case.device}")
    else:
        [s] = nvml_windows(case, [case.device], seconds, nvml=nvml, sync=sync)
    if not isinstance(s, NvmlSummary):
        return [ProbeFigure(name, s, unit, note) for name, unit, note, _, _ in _NVML_FIGURES]
    extra = f"; {s.failure}" if s.failure else ""
    figures = []
    for name, unit, note, metric_name, stat in _NVML_FIGURES:
        metric: MetricSummary | Unavailable = getattr(s, metric_name)
        value = metric if isinstance(metric, Unavailable) else getattr(metric, stat)
        figures.append(ProbeFigure(name, value, unit, note + extra))
    return figures


def _peak_memory(case: Case) -> ProbeFigure:
    name, unit = "CUDA max memory allocated", "MiB"
    if not is_cuda_device(case.device):
        return ProbeFigure(name, _not_on_cuda(case), unit)
    torch.cuda.reset_peak_memory_stats(case.device)
    case()
    synchronize(case.device)
    return ProbeFigure(name, torch.cuda.max_memory_allocated(case.device) / MIB, unit, "one call, this process")


def _speedup(case: Case, other: Case, rounds: int, sync: Callable[[], None]) -> ProbeFigure:
    name = f"speedup over {other.variant}"
    try:
        speedup = case_speedup(other, case, rounds=rounds, sync=sync)
    except torch._dynamo.exc.BackendCompilerFailed as err:
        # The case itself compiled already (first call above), so this is the baseline failing to compile: a
        # fact about torch on this machine worth reporting, not a reason to lose every other figure.
        return ProbeFigure(name, Unavailable(f"{other.variant}: {compile_failure_reason(err)}"), "x")
    if getattr(case, "block", None) is not None and getattr(other, "block", None) is not None:
        note = f"{other.variant} time / this time, median of {speedup.rounds} steady-state block pairs, one live"
    else:
        note = f"{other.variant} time / this time, median of {rounds} interleaved rounds"
    if other.variant == case.variant:
        note += "; this is the baseline, so it shows the noise"
    return ProbeFigure(name, speedup.ratio, "x", note)


def probe_case(
    case: Case,
    *,
    baseline_case: Case,
    applies: frozenset[str] = ALL_FIGURES,
    trace_path: str | Path | None = None,
    rounds: int = 10,
    min_run_time: float = 0.5,
    nvml_seconds: float = 1.0,
    nvml: Any = None,
) -> list[ProbeFigure]:
    """Run every probe on one case.

    Args:
        case: a `pitfalls.cases.Case` (or anything with its attributes that runs one call when called).
        baseline_case: the case to compare with, usually the family's naive variant at the same parameters.
        applies: the figures that apply to the case's family (see `pitfalls.family.ALL_FIGURES`); the others
            read "unavailable: does not apply to the <family> family".
        trace_path: also write a Chrome trace of three calls there (hazards labelled for eager cases).
        rounds: interleaved rounds for the speedup, and calls for the CUDA sync and event counts (>= 1).
        min_run_time: seconds torch.utils.benchmark spends on the wall time (> 0).
        nvml_seconds: seconds to loop the case while NVML samples (> 0); CUDA cases only.
        nvml: the NVML binding; None imports pynvml.

    Returns:
        The figures, in a fixed order.
    """
    for attr in ("family", "variant", "device", "compiled", "params"):
        if not hasattr(case, attr):
            raise TypeError(f"case must be a pitfalls Case (it has no {attr!r}), got {type(case).__name__}")
    check_callable("case", case)
    _check_positive("rounds", rounds, int)
    _check_positive("min_run_time", min_run_time, float)
    _check_positive("nvml_seconds", nvml_seconds, float)

    def sync() -> None:
        synchronize(case.device)

    figures: list[ProbeFigure] = []
    if case.compiled:
        figures += _compile_figures(case, sync)

    def call_synced() -> None:
        case()
        sync()

    block = getattr(case, "block", None)
    if block is not None:
        # Workers, queues or ranks: the case's own steady-state routine, as asv times it (a ddp call from here
        # would time the control round trip; a loader's, batches its workers made in advance).
        per_block = [block(1) for _ in range(TIME_BLOCKS)]
        figures.append(ProbeFigure("time per call", statistics.median(per_block) * 1e3, "ms",
                                   f"median of {TIME_BLOCKS} steady-state blocks, the case's own routine"))
    else:
        wall = wall_time(call_synced, warmup=1, min_run_time=min_run_time)
        figures.append(ProbeFigure("time per call", wall.median_s * 1e3, "ms",
                                   f"median of {wall.blocks} blocks, torch.utils.benchmark"))
    not_here = Unavailable(f"does not apply to the {case.family} family")
    if CUDA not in applies:
        events: CudaEventTiming | Unavailable = not_here  # e.g. a multi-process step: this process runs no kernel
    elif is_cuda_device(case.device):
        events = cuda_event_time(case, calls=rounds)
    else:
        events = _not_on_cuda(case)
    events_ms = events if isinstance(events, Unavailable) else events.median_ms
    figures.append(ProbeFigure("time per call (CUDA events)", events_ms, "ms"))

    if SPEEDUP in applies:
        figures.append(_speedup(case, baseline_case, rounds, sync))
    if HAZARDS in applies:
        figures += _hazard_figures(case)
    else:
        figures.append(ProbeFigure("sync hazards per call", not_here, "ops"))
    if CUDA in applies:
        syncs = count_cuda_syncs(case, calls=rounds) if is_cuda_device(case.device) else _not_on_cuda(case)
        per_call = syncs if isinstance(syncs, Unavailable) else syncs.per_call
        figures.append(ProbeFigure("host-device syncs per call", per_call, "syncs", "CUDA sync debug mode"))
    if NVML in applies:
        figures += _nvml_figures(case, nvml_seconds, nvml, sync)
    if CUDA in applies:
        figures.append(_peak_memory(case))
    if trace_path is not None:
        result = export_trace(case, trace_path, steps=3, device=case.device, label_hazards=not case.compiled)
        figures.append(ProbeFigure("trace", str(result.path), "", "open in https://ui.perfetto.dev"))
    return figures


def render(figures: list[ProbeFigure], *, title: str | None = None) -> Table:
    """Lay figures out as a rich table; an unavailable figure reads "unavailable: <reason>".

    Args:
        figures: what `probe_case` returned.
        title: the table's title, e.g. the case's name.

    Returns:
        A `rich.table.Table` with columns figure, value, unit, note.
    """
    # Here, not at the top: the probes run in processes that print no table (ranks, benchmarks), and rich's table
    # costs each of them a tenth of a second to import.
    from rich.table import Table

    table = Table(title=title)
    table.add_column("figure")
    table.add_column("value", justify="right")
    table.add_column("unit")
    table.add_column("note", overflow="fold")
    for f in figures:
        style = "dim" if isinstance(f.value, Unavailable) else None
        table.add_row(f.name, f"{f.value:.4g}" if isinstance(f.value, float) else str(f.value), f.unit, f.note,
                      style=style)
    return table

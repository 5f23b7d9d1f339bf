"""Which published figures no calibration check reads: marked "uncalibrated" by `pitfalls probe` and the report."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from pitfalls.calibration.published import ERROR_METHOD
from pitfalls.known.table import (
    COMPILE_SECONDS,
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
    calibrated_instruments,
    own_instrument,
)

__all__ = ["instrument_of", "uncalibrated"]

# The benchmark that publishes each check's error (`pitfalls.calibration.published`).
_CALIBRATION_ERROR = ("calibration", ERROR_METHOD)
# The instrument behind each figure `pitfalls probe` prints, and each asv benchmark method of the shared bases.
_BY_NAME = {
    "time per call": TIME_PER_CALL,
    "time per call (CUDA events)": CUDA_EVENT_TIME,
    "sync hazards per call": SYNC_HAZARDS,
    "host-device syncs per call": CUDA_SYNCS,
    "graph breaks": GRAPH_BREAKS,
    "GPU busy (NVML utilization, sampled)": NVML_BUSY,
    "CUDA max memory allocated": CUDA_PEAK_MEMORY,
    "time": TIME_PER_CALL,
    "peakmem": PEAK_MEMORY,
    "track_speedup": SPEEDUP,
    "track_sync_hazards": SYNC_HAZARDS,
    "track_compile_seconds": COMPILE_SECONDS,
    "track_graph_breaks": GRAPH_BREAKS,
    "track_recompiles": RECOMPILES,
    "track_cuda_syncs": CUDA_SYNCS,
    "track_cuda_peak_memory": CUDA_PEAK_MEMORY,
    "track_gpu_busy": NVML_BUSY,
    "track_gpu_memory": NVML_MEMORY,
}


def instrument_of(family: str, figure: str) -> str:
    """The instrument key of a figure: a shared one by its probe or asv name, else the family's own (an asv
    method by the name of the figure it publishes, `pitfalls.family.Family.benchmark_figures`)."""
    if figure.startswith("speedup over"):
        return SPEEDUP
    if figure.startswith(("time_", "peakmem_")):
        return _BY_NAME[figure.split("_", 1)[0]]
    return _BY_NAME.get(figure, own_instrument(family, _published(family).get(figure, figure)))


def _published(family: str) -> Mapping[str, str]:
    """A registered family's asv methods by the figure each publishes; none for a name no family has."""
    from pitfalls import registry  # the families import the calibration tables

    return registry.family(family).benchmark_figures if family in registry.family_names() else {}


def uncalibrated(family: str, figures: Iterable[str], checks: Iterable[Check]) -> list[str]:
    """The figures (by name) that no check calibrates; breakdown lines (indented) and the trace are not figures."""
    known = calibrated_instruments(checks)
    return [f for f in figures if not f.startswith(" ") and f != "trace" and instrument_of(family, f) not in known]


def uncalibrated_benchmarks(benchmarks: Iterable[tuple[str, str]], checks: Iterable[Check]) -> list[str]:
    """The asv benchmarks (``(family, "bench_x.Class.method")``) whose figure no check calibrates, sorted."""
    known = calibrated_instruments(checks)
    methods = ((family, benchmark, benchmark.rsplit(".", 1)[-1]) for family, benchmark in benchmarks)
    # The calibration table itself publishes no figure of an instrument.
    return sorted({benchmark for family, benchmark, method in methods
                   if (family, method) != _CALIBRATION_ERROR and instrument_of(family, method) not in known})

"""A figure no calibration check reads is marked uncalibrated; one a check names is not."""

import json

from pitfalls.calibration.marks import instrument_of, uncalibrated, uncalibrated_benchmarks
from pitfalls.calibration.run import all_checks
from pitfalls.known.table import (
    COMPILE_SECONDS,
    SPEEDUP,
    TIME_PER_CALL,
    calibrated_instruments,
    own_instrument,
)
from pitfalls.registry import BUILTIN
from pitfalls.suite_description import COMMITTED


def test_shared_figures_map_to_their_instruments() -> None:
    assert instrument_of("loss", "time per call") == TIME_PER_CALL
    assert instrument_of("loss", "speedup over naive") == SPEEDUP
    assert instrument_of("loss", "time_step") == TIME_PER_CALL
    assert instrument_of("loader", "samples/s") == own_instrument("loader", "samples/s")
    assert instrument_of("parallel", "track_step_time") == own_instrument("parallel", "step time")


def test_only_figures_without_a_check_are_marked() -> None:
    names = ["time per call", "speedup over naive", "sync hazards per call", "  nonzero", "trace",
             "GPU power (NVML)", "widgets per second"]
    assert uncalibrated("nosuch", names, all_checks()) == ["GPU power (NVML)", "widgets per second"]


def _published() -> set[tuple[str, str]]:
    """(family, asv method) of every benchmark of the committed suite description."""
    names = json.loads(COMMITTED.read_text())
    return {(name.split(".", 1)[0].removeprefix("bench_"), name.rsplit(".", 1)[-1]) for name in names if "." in name}


def test_every_check_of_a_family_reads_a_figure_the_suite_publishes() -> None:
    read = {instrument_of(family, method) for family, method in _published()}
    for family in BUILTIN:
        for check in family.calibrations:
            own = {i for i in check.instruments if i.startswith(f"{family.name}: ")}
            assert own <= read, f"{check.name}: no benchmark of the suite publishes {sorted(own - read)}"


def test_a_benchmark_figure_names_a_method_of_the_suite_and_a_figure_the_familys_checks_read() -> None:
    published = _published()
    for family in BUILTIN:
        calibrated = calibrated_instruments(family.calibrations)
        for method, figure in family.benchmark_figures.items():
            assert (family.name, method) in published
            assert own_instrument(family.name, figure) in calibrated


def test_the_report_marks_a_calibrated_family_figure_calibrated_and_its_neighbour_not() -> None:
    benchmarks = {("parallel", "bench_parallel.Step.track_step_time"),
                  ("parallel", "bench_parallel.Ranks.track_samples_per_second"),
                  ("parallel", "bench_parallel.Ranks.track_exposed_communication"),
                  ("parallel", "bench_parallel.Ranks.track_communication"),
                  ("parallel", "bench_parallel.Ranks.track_memory_imbalance"),
                  ("parallel", "bench_parallel.Ranks.track_busy_others"),
                  ("loader", "bench_loader.Memory.track_uss"),
                  ("loader", "bench_loader.Metadata.track_table"),
                  ("loader", "bench_loader.Nvml.track_gpu_power")}
    assert uncalibrated_benchmarks(benchmarks, all_checks()) == [
        "bench_loader.Nvml.track_gpu_power", "bench_parallel.Ranks.track_busy_others"]


def test_the_published_compile_seconds_are_calibrated_by_the_compile_row() -> None:
    names = sorted(name for name in json.loads(COMMITTED.read_text()) if name.endswith(".track_compile_seconds"))
    assert names == ["bench_loss.Compile.track_compile_seconds", "bench_sampler.Compile.track_compile_seconds"]
    benchmarks = [(name.split(".", 1)[0].removeprefix("bench_"), name) for name in names]
    assert uncalibrated_benchmarks(benchmarks, all_checks()) == []
    # Without the row that reads it, the figure is marked again: the mapping alone calibrates nothing.
    others = [c for c in all_checks() if COMPILE_SECONDS not in c.instruments]
    assert uncalibrated_benchmarks(benchmarks, others) == names

"""The calibration table in the asv suite: one series per check, holding the error `verdict` computes."""

from __future__ import annotations

import pytest
import torch
from suite import import_suite_module

from pitfalls.calibration import published, run
from pitfalls.known.table import CPU, CUDA, Check, Reading, verdict
from pitfalls.result import Unavailable

bench_calibration = import_suite_module("bench_calibration")


def error_classes(module: object) -> dict[str, type]:
    return {name: cls for name, cls in vars(module).items()
            if isinstance(cls, type) and hasattr(cls, published.ERROR_METHOD) and not name.startswith("_")}


def fake(name: str, reading: Reading, *, tolerance: float = 0.10, unit: str = "ms", absolute: bool = False,
         device: str = CPU) -> Check:
    return Check(name, ("time per call",), unit, tolerance, lambda _device: reading, device=device,
                 absolute=absolute)


def test_every_check_is_benchmarked_once_by_the_suite():
    classes = error_classes(bench_calibration)
    benchmarked = [name for cls in classes.values() for name in cls.params[0]]
    assert sorted(benchmarked) == sorted(c.name for c in published.published_checks(run.all_checks()))
    assert any(not c.published for c in run.all_checks())  # the doctor's rows: run by pitfalls calibrate alone
    # A family's own rows are published by the committed calibrate runs, not by asv.
    assert {c.family for c in run.all_checks() if c.name not in benchmarked} >= {"loader", "parallel"}
    assert len(set(benchmarked)) == len(benchmarked)
    by_name = {c.name: c for c in run.all_checks()}
    for cls in classes.values():
        assert cls.param_names == [published.CHECK_PARAM]
        unit = getattr(cls, published.ERROR_METHOD).unit
        assert {published.error_unit(by_name[n]) for n in cls.params[0]} == {unit}, cls.__name__


def test_a_new_check_gets_a_series_and_an_absolute_unit_its_own_class(monkeypatch):
    planted = Reading(planted=50.0, measured=52.0)
    extra = (fake("fake: relative", planted), fake("fake: watts", planted, unit="W", absolute=True))
    monkeypatch.setattr(run, "all_checks", lambda: extra)
    classes = bench_calibration.error_classes("bench_fake")
    assert {name: cls.params for name, cls in classes.items()} == {
        "Error": [["fake: relative"]], "ErrorInW": [["fake: watts"]]}
    assert classes["Error"].track_error.unit == "relative"
    assert classes["ErrorInW"].track_error.unit == "W"
    # The shared method is copied, not relabelled: the real classes keep their own units.
    assert error_classes(bench_calibration)["Error"].track_error.unit == "relative"


def test_a_check_not_published_gets_no_series():
    planted = Reading(planted=1.0, measured=1.0)
    kept = fake("fake: published", planted)
    left = Check("fake: a command's figure", ("time per call",), "ms", 0.1, lambda _device: planted, published=False)
    assert published.checks_by_error_unit([kept, left]) == {"relative": ["fake: published"]}


@pytest.mark.parametrize(("reading", "absolute", "unit", "want"), [
    (Reading(planted=20.0, measured=23.0), False, "ms", 0.15),  # a fail is published too: its error is the figure
    (Reading(planted=20.0, measured=19.5), False, "ms", 0.025),
    (Reading(planted=50.0, measured=41.0), True, "%", 9.0),
    (Reading(planted=3, measured=3), False, "ops", 0.0),  # a measured 0 stays 0
])
def test_the_tracked_value_is_the_verdicts_error(monkeypatch, reading, absolute, unit, want):
    check = fake("fake: planted", reading, unit=unit, absolute=absolute)
    monkeypatch.setattr(run, "all_checks", lambda: (check,))
    [cls] = bench_calibration.error_classes("bench_fake").values()
    benchmark = cls()
    benchmark.setup(check.name)
    value = benchmark.track_error(check.name)
    assert value == verdict(check, reading).error
    assert value == pytest.approx(want)


def test_an_unavailable_reading_is_a_skip_with_its_reason_not_zero(monkeypatch):
    check = fake("fake: cannot read", Reading(planted=1.0, measured=Unavailable("no such counter on this kernel")))
    monkeypatch.setattr(run, "all_checks", lambda: (check,))
    [cls] = bench_calibration.error_classes("bench_fake").values()
    with pytest.raises(NotImplementedError, match="no such counter on this kernel"):
        cls().setup(check.name)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present: the CUDA checks run")
def test_a_cuda_check_on_a_cpu_machine_is_a_skip_naming_the_missing_device():
    cls = error_classes(bench_calibration)["Error"]
    with pytest.raises(NotImplementedError, match="not run here: no CUDA device"):
        cls().setup("cuda: one .item() is one sync")


def test_a_cpu_check_runs_through_the_benchmark_and_reads_its_planted_value():
    cls = error_classes(bench_calibration)["Error"]
    benchmark = cls()
    benchmark.setup("sync hazards: 3 planted .item()")
    assert benchmark.track_error("sync hazards: 3 planted .item()") == 0.0


def test_an_unknown_check_is_refused_naming_the_allowed_ones():
    with pytest.raises(ValueError, match=r"'nope' is not a calibration check; allowed: .*time: busy-wait 5 ms"):
        published.measured_error("nope", CPU)
    with pytest.raises(ValueError, match="device='tpu' is not allowed"):
        published.measured_error("time: busy-wait 5 ms", "tpu")


def test_error_class_names_are_identifiers():
    assert published.error_class_name(published.RELATIVE) == "Error"
    assert published.error_class_name("%") == "ErrorInPercent"
    assert published.error_class_name("samples/s") == "ErrorInSamplesS"
    assert all(published.error_class_name(c.unit).isidentifier() for c in run.all_checks())


def test_a_cuda_check_is_not_run_with_device_cpu_whatever_the_machine_has():
    check = fake("fake: cuda", Reading(planted=1.0, measured=1.0), device=CUDA)
    error = published.measured_error(check.name, CPU, (check,))
    assert isinstance(error, Unavailable) and error.reason.startswith("not run here")


def test_the_gpu_runs_calibration_slice_selects_the_published_cuda_rows_and_no_cpu_row():
    import re

    from pitfalls.gpu_run.slices import cuda_calibration_selection

    pattern = re.compile(cuda_calibration_selection())
    classes = error_classes(bench_calibration)
    by_name = {c.name: c for c in run.all_checks()}
    selected = {name for cls_name, cls in classes.items() for name in cls.params[0]
                if pattern.search(f"bench_calibration.{cls_name}.track_error({name!r})")}
    # A command's CUDA rows (the doctor's rules) are not asv's: the GPU run reads them through `pitfalls calibrate`.
    assert selected == {name for name, check in by_name.items() if check.device == CUDA and check.published}
    assert selected  # the table has CUDA rows for the GPU run to run

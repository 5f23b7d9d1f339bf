"""A figure no calibration check reads is marked uncalibrated; one a check names is not."""

from pitfalls.calibration.marks import instrument_of, uncalibrated
from pitfalls.calibration.run import all_checks
from pitfalls.calibration.table import SPEEDUP, TIME_PER_CALL, own_instrument


def test_shared_figures_map_to_their_instruments() -> None:
    assert instrument_of("loss", "time per call") == TIME_PER_CALL
    assert instrument_of("loss", "speedup over naive") == SPEEDUP
    assert instrument_of("loss", "time_step") == TIME_PER_CALL
    assert instrument_of("loader", "samples/s") == own_instrument("loader", "samples/s")


def test_only_figures_without_a_check_are_marked() -> None:
    names = ["time per call", "speedup over naive", "sync hazards per call", "  nonzero", "trace",
             "GPU power (NVML)", "widgets per second"]
    assert uncalibrated("nosuch", names, all_checks()) == ["GPU power (NVML)", "widgets per second"]

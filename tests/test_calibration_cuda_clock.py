"""The GPU clock the CUDA calibration rows size their ``_sleep`` kernels by, against a fake ``torch.cuda``."""

from __future__ import annotations

import pytest
import torch
from fakes import FakeClock, FakeEvent

from pitfalls.calibration import figure_checks as shared


class FakeGpu:
    """``_sleep``, ``synchronize`` and ``Event`` of one GPU: each sleep runs at the next rate of ``rates`` (cycles
    per ms; the last repeats) and advances the shared clock by its length; ``log`` holds every call in order."""

    def __init__(self, rates: list[float]) -> None:
        self.clock = FakeClock()
        self.rates = rates
        self.log: list[str] = []

    def sleep(self, cycles: int) -> None:
        rate = self.rates.pop(0) if len(self.rates) > 1 else self.rates[0]
        self.log.append(f"sleep {cycles}")
        self.clock.advance(cycles / rate / 1e3)

    def synchronize(self) -> None:
        self.log.append("synchronize")

    def event(self, enable_timing: bool = False) -> FakeEvent:
        assert enable_timing, "an event made without timing cannot be read"
        gpu = self

        class LoggedEvent(FakeEvent):
            def record(self) -> None:
                gpu.log.append("record")
                super().record()

        return LoggedEvent(self.clock)


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch) -> FakeGpu:
    # The first sleep reads a fifth of the clock (module loading, a clock ramping up from idle); then three
    # calibrations, one stretched (the GPU preempted), one slightly fast.
    fake = FakeGpu(rates=[400_000.0, 2_000_000.0, 1_000_000.0, 2_100_000.0])
    monkeypatch.setattr(torch.cuda, "_sleep", fake.sleep)
    monkeypatch.setattr(torch.cuda, "synchronize", fake.synchronize)
    monkeypatch.setattr(torch.cuda, "Event", fake.event)
    return fake


def test_the_clock_is_the_median_of_three_event_timed_sleeps_after_a_warm_up(gpu: FakeGpu) -> None:
    cycles_per_ms = shared._cycles_per_ms()
    # Neither the warm-up's slow reading nor the mean of the three (1.7e6): the middle one.
    assert cycles_per_ms == pytest.approx(2_000_000.0)
    timed = ["record", f"sleep {shared.CALIBRATION_CYCLES}", "record", "synchronize"]
    assert gpu.log == [f"sleep {shared.WARMUP_CYCLES}", "synchronize", *timed * shared.CYCLE_CALIBRATIONS]


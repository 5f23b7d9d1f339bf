"""The calibration family's planted costs: a call lasts its planted length, whatever else it does inside it."""

from __future__ import annotations

import ctypes
import threading

import pytest
import torch

from pitfalls.families import calibration


class FakeClock:
    """The family's wall and CPU clocks in one (an idle core): every reading advances 0.1 ms; ``spend`` advances it
    by work done."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        self.now += 1e-4
        return self.now

    def spend(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(calibration.time, "perf_counter", fake)
    monkeypatch.setattr(calibration.time, "thread_time", fake)
    return fake


def call_length(clock: FakeClock, variant: str, ms: float, mib: int) -> float:
    case = calibration.build(variant, torch.device("cpu"), False, {"ms": ms, "items": 3, "mib": mib})
    start = clock.now
    case()
    return (clock.now - start) * 1e3


@pytest.mark.parametrize("touch_ms", [0.0, 3.4, 12.0])
def test_touching_memory_is_inside_the_planted_length_not_added_to_it(clock, monkeypatch, touch_ms):
    real_touch = calibration.touch

    def slow_touch(mib: int, device: torch.device) -> torch.Tensor:
        clock.spend(touch_ms / 1e3)  # a loaded machine's page faults
        return real_touch(mib, device)

    monkeypatch.setattr(calibration, "touch", slow_touch)
    half = call_length(clock, calibration.HALF, 20, mib=16)
    naive = call_length(clock, calibration.NAIVE, 20, mib=16)
    # Each call ends at its deadline, to the clock's 0.1 ms tick (and the tick of the return).
    assert half == pytest.approx(20, abs=0.3)
    assert naive == pytest.approx(40, abs=0.3)
    assert naive / half == pytest.approx(2.0, rel=0.02)


def test_the_recorded_length_is_the_whole_call(clock, monkeypatch):
    monkeypatch.setattr(calibration, "touch", lambda mib, device: clock.spend(5e-3))
    with calibration.recording() as record:
        call_length(clock, calibration.HALF, 20, mib=16)
    [(planted_ms, seconds)] = record
    assert planted_ms == 20 and seconds * 1e3 == pytest.approx(20, abs=0.5)




def test_time_the_thread_is_parked_does_not_count_as_planted_work(monkeypatch):
    cpu = FakeClock()
    parked = 0.0

    def wall() -> float:  # the wall clock runs with the CPU clock, and on while the thread is parked
        return cpu.now + parked

    def park(_mib: int, _device: torch.device) -> None:
        nonlocal parked
        parked += 8e-3

    monkeypatch.setattr(calibration.time, "perf_counter", wall)
    monkeypatch.setattr(calibration.time, "thread_time", cpu)
    monkeypatch.setattr(calibration, "touch", park)
    with calibration.recording() as record:
        case = calibration.build(calibration.HALF, torch.device("cpu"), False, {"ms": 20, "items": 0, "mib": 16})
        cpu_start = cpu.now
        case()
    # 20 ms of CPU were done, whatever the wall clock did; the record holds the wall length (the truth a timer sees).
    assert (cpu.now - cpu_start) * 1e3 == pytest.approx(20, abs=0.3)
    [(_, seconds)] = record
    assert seconds * 1e3 == pytest.approx(28, abs=0.3)


def touched_blocks(monkeypatch: pytest.MonkeyPatch) -> tuple[list[torch.Tensor], list[tuple[int, int]]]:
    """The blocks the planted calls touch, and every (address, bytes) memset writes on this thread, recorded."""
    blocks: list[torch.Tensor] = []
    memsets: list[tuple[int, int]] = []
    real_touch, real_memset, caller = calibration.touch, ctypes.memset, threading.get_ident()

    def recorded_touch(mib: int, device: torch.device) -> torch.Tensor:
        blocks.append(real_touch(mib, device))
        return blocks[-1]

    def recorded_memset(address: int, value: int, size: int) -> int:
        assert threading.get_ident() == caller, "memset must run on the calling thread (its CPU clock)"
        memsets.append((address, size))
        return int(real_memset(address, value, size))

    monkeypatch.setattr(calibration, "touch", recorded_touch)
    monkeypatch.setattr(calibration.ctypes, "memset", recorded_memset)
    return blocks, memsets


def test_the_planted_memory_lands_on_the_device_the_case_runs_on(monkeypatch):
    blocks, memsets = touched_blocks(monkeypatch)
    # meta stands for a device that is not the host (a GPU here): torch allocates there, nothing on the host.
    case = calibration.build(calibration.HALF, torch.device("meta"), False, {"ms": 0, "items": 0, "mib": 2})
    case()
    [block] = blocks
    assert block.device.type == "meta" and block.numel() == 2 * calibration.MIB
    assert memsets == []  # never a host memset on a device pointer


def test_on_the_host_the_planted_memory_is_still_written_by_memset_on_this_thread(monkeypatch):
    blocks, memsets = touched_blocks(monkeypatch)
    case = calibration.build(calibration.HALF, torch.device("cpu"), False, {"ms": 0, "items": 0, "mib": 2})
    case()
    [block] = blocks
    assert block.device.type == "cpu" and block.numel() == 2 * calibration.MIB
    assert memsets == [(block.data_ptr(), 2 * calibration.MIB)]
    assert bool((block == 1).all())  # every byte written

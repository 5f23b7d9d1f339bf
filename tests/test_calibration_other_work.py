"""Other work beside a timed row: the meter's arithmetic, the wait for free cores, and the note a row carries."""

from __future__ import annotations

import itertools
import subprocess
import sys
import time
from collections.abc import Iterator

import psutil
import pytest

from pitfalls.known import other_work
from pitfalls.known.other_work import (
    QUIET_CORES,
    Conditions,
    OtherWork,
    OtherWorkMeter,
    allowed_other_work,
    machine_busy_seconds,
    wait_for_cores,
)
from pitfalls.result import Unavailable


def _values(*values: float) -> Iterator[float]:
    return iter(values)


def test_the_meter_counts_the_machines_busy_time_less_this_process_tree() -> None:
    # 2 s of wall time; the machine busy for 3.1 CPU-seconds of it, this process and its children for 1.1.
    busy, own, clock = _values(100.0, 103.1), _values(10.0, 11.1), _values(50.0, 52.0)
    with OtherWorkMeter(busy=lambda: next(busy), own=lambda: next(own), clock=lambda: next(clock)) as meter:
        pass
    assert meter.result == OtherWork(cores=pytest.approx(1.0), seconds=2.0)


def test_a_child_reaped_inside_the_window_never_makes_other_work_negative() -> None:
    # A child's whole life of CPU lands in this process's children times when it is reaped.
    busy, own, clock = _values(100.0, 100.5), _values(10.0, 14.0), _values(0.0, 1.0)
    with OtherWorkMeter(busy=lambda: next(busy), own=lambda: next(own), clock=lambda: next(clock)) as meter:
        pass
    assert meter.result == OtherWork(cores=0.0, seconds=1.0)


def test_no_cpu_counters_is_unavailable_with_the_path(tmp_path) -> None:  # type: ignore[no-untyped-def]
    missing = tmp_path / "stat"
    read = machine_busy_seconds(str(missing))
    assert isinstance(read, Unavailable) and str(missing) in read.reason
    with OtherWorkMeter(busy=lambda: machine_busy_seconds(str(missing))) as meter:
        pass
    assert isinstance(meter.result, Unavailable)


def test_a_row_is_allowed_the_cores_it_leaves_and_the_quiet_machines_own() -> None:
    assert allowed_other_work(1, cores=2) == pytest.approx(1 + QUIET_CORES)
    assert allowed_other_work(3, cores=2) == pytest.approx(QUIET_CORES)  # workers: it needs the machine


def test_the_wait_ends_at_the_first_look_that_leaves_the_cores_free() -> None:
    looks = iter([OtherWork(1.9, 0.5), OtherWork(1.4, 0.5), OtherWork(0.05, 0.5), OtherWork(1.9, 0.5)])
    clock = itertools.count(0.0, 0.5)
    waited, seen = wait_for_cores(1, timeout_s=10, cores=2, watch=lambda _s: next(looks), clock=lambda: next(clock))
    assert seen == OtherWork(0.05, 0.5) and waited == 1.5


def test_the_wait_gives_up_after_its_bound_and_says_what_it_saw() -> None:
    clock = itertools.count(0.0, 0.5)
    busy = OtherWork(1.9, 0.5)
    waited, seen = wait_for_cores(1, timeout_s=2, cores=2, watch=lambda _s: busy, clock=lambda: next(clock))
    assert waited == 2.0 and seen == OtherWork(1.9, 0.5)


def test_the_wait_does_not_wait_where_other_work_cannot_be_read() -> None:
    gone = Unavailable("no /proc/stat")
    clock = itertools.count(0.0, 0.5)
    waited, seen = wait_for_cores(1, timeout_s=10, watch=lambda _s: gone, clock=lambda: next(clock))
    assert seen is gone and waited == 0.5


def test_the_note_says_the_other_work_and_whether_it_left_the_row_its_cores() -> None:
    given = Conditions(1, 1.1, 0.5, OtherWork(0.02, 0.5), OtherWork(0.04, 5.0))
    assert given.given and given.note() == "other work 0.04 cores"  # one look: no wait to speak of
    waited = Conditions(1, 1.1, 4.0, OtherWork(0.02, 0.5), OtherWork(0.04, 5.0))
    assert waited.note() == "other work 0.04 cores (waited 4.0 s for free cores)"
    beside = Conditions(3, 0.1, 10.0, OtherWork(1.2, 0.5), OtherWork(1.25, 6.0))
    assert beside.given is False
    assert beside.note() == "other work 1.25 cores, over the 0.10 that leave it 3 free (waited 10.0 s for free cores)"
    unread = Conditions(1, 1.1, 0.0, Unavailable("no /proc/stat"), Unavailable("no /proc/stat"))
    assert unread.given is None and unread.note() == "other work not measured (no /proc/stat)"


@pytest.mark.serial
def test_the_meter_reads_a_planted_busy_process() -> None:
    """Known answer: a child that keeps a core busy; the meter reads at least the CPU the kernel charged it."""
    if isinstance(machine_busy_seconds(), Unavailable):
        pytest.skip("no /proc/stat: other processes' CPU cannot be read here")
    child = subprocess.Popen([sys.executable, "-c", "import time\nend = time.monotonic() + 4\n"
                              "while time.monotonic() < end: pass"])
    try:
        time.sleep(0.5)  # the interpreter has started and spins
        spinner = psutil.Process(child.pid)
        before, began = sum(spinner.cpu_times()[:2]), time.perf_counter()
        with OtherWorkMeter() as meter:
            time.sleep(1.5)
        charged = (sum(spinner.cpu_times()[:2]) - before) / (time.perf_counter() - began)
    finally:
        child.kill()
        child.wait()
    assert isinstance(meter.result, OtherWork)
    # Both counters tick at 10 ms: a few ticks of slack over 1.5 s. Other tenants only add to the reading.
    assert charged > 0.3 and meter.result.cores >= charged - 0.08, (meter.result, charged)


def test_the_wait_bound_is_read_when_a_row_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    # The bound is read when the row runs, so that a test can time a row at once, as it was before it waited.
    seen: list[float] = []

    def fake_wait(needs: int, *, timeout_s: float, **_: object) -> tuple[float, OtherWork]:
        seen.append(timeout_s)
        return 0.0, OtherWork(0.0, 0.5)

    monkeypatch.setattr(other_work, "wait_for_cores", fake_wait)
    monkeypatch.setattr(other_work, "WAIT_S", 0.0)
    value, conditions = other_work.on_free_cores(lambda: 7, 1)
    assert value == 7 and seen == [0.0] and conditions.needs == 1

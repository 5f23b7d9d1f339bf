"""Timing probes: interleaved speedup with a fake clock, CUDA events with a fake CUDA, wall time for real."""

from __future__ import annotations

import pytest
import torch
from fakes import FakeClock, FakeCuda

from pitfalls.probes._cuda import cuda_unavailable_reason
from pitfalls.probes.timing import (
    CudaEventTiming,
    Speedup,
    WallTiming,
    cuda_event_time,
    interleaved_speedup,
    wall_time,
)
from pitfalls.result import Unavailable


def sleeper(clock: FakeClock, seconds: list[float], log: list[str], name: str):
    """A callable that advances the fake clock by the next duration in turn and logs its name."""
    durations = iter(seconds)

    def call() -> None:
        log.append(name)
        clock.advance(next(durations))

    return call


def test_interleaved_speedup_alternates_and_reports_exact_ratios() -> None:
    clock, log = FakeClock(), []
    # one warm-up round (durations 9 and 9, never timed), then three timed rounds
    baseline = sleeper(clock, [9.0, 4.0, 6.0, 8.0], log, "A")
    candidate = sleeper(clock, [9.0, 2.0, 2.0, 1.0], log, "B")

    result = interleaved_speedup(baseline, candidate, rounds=3, warmup=1, clock=clock)

    assert log == ["A", "B"] * 4
    assert result.ratios == (2.0, 3.0, 8.0)
    assert result == Speedup(ratio=3.0, ratios=(2.0, 3.0, 8.0), baseline_median_s=6.0,
                             candidate_median_s=2.0, rounds=3)


def test_interleaved_speedup_below_one_means_the_candidate_is_slower() -> None:
    clock = FakeClock()
    result = interleaved_speedup(
        sleeper(clock, [1.0, 1.0], [], "A"), sleeper(clock, [4.0, 2.0], [], "B"),
        rounds=2, warmup=0, clock=clock,
    )
    assert result.ratios == (0.25, 0.5)
    assert result.ratio == 0.375


def test_interleaved_speedup_syncs_around_every_timed_call() -> None:
    clock, events = FakeClock(), []

    def sync() -> None:
        events.append("sync")

    def work(name: str):
        def call() -> None:
            events.append(name)
            clock.advance(1.0)
        return call

    interleaved_speedup(work("A"), work("B"), rounds=1, warmup=0, clock=clock, sync=sync)
    assert events == ["sync", "A", "sync", "sync", "B", "sync"]


def test_interleaved_speedup_rejects_a_clock_that_does_not_advance() -> None:
    clock = FakeClock()
    with pytest.raises(ValueError, match="non-positive duration in round 0"):
        interleaved_speedup(lambda: None, lambda: None, rounds=1, warmup=0, clock=clock)


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"rounds": 0}, ValueError, "rounds must be an int >= 1, got 0"),
    ({"rounds": True}, ValueError, "rounds must be an int >= 1, got True"),
    ({"warmup": -2}, ValueError, "warmup must be an int >= 0, got -2"),
    ({"clock": 3.0}, TypeError, "clock must be callable, got float"),
    ({"sync": None}, TypeError, "sync must be callable, got NoneType"),
])
def test_interleaved_speedup_rejects_bad_arguments(kwargs, error, message) -> None:
    with pytest.raises(error, match=message):
        interleaved_speedup(lambda: None, lambda: None, **kwargs)


def test_interleaved_speedup_rejects_a_non_callable_candidate() -> None:
    with pytest.raises(TypeError, match="candidate must be callable, got int"):
        interleaved_speedup(lambda: None, 5)  # type: ignore[arg-type]


def test_cuda_event_time_keeps_warmup_out_and_times_each_call() -> None:
    cuda = FakeCuda()
    durations = iter([5.0, 0.002, 0.004, 0.003])  # the first is the warm-up call

    def call() -> None:
        cuda.clock.advance(next(durations))

    result = cuda_event_time(call, calls=3, warmup=1, cuda=cuda)
    assert isinstance(result, CudaEventTiming)
    assert result.times_ms == pytest.approx((2.0, 4.0, 3.0))
    assert result.median_ms == pytest.approx(3.0)
    assert cuda.synchronized == 1


def test_cuda_event_time_without_cuda_is_unavailable_with_the_reason() -> None:
    reason = cuda_unavailable_reason()
    if reason is None:
        pytest.skip("CUDA is usable here")
    assert cuda_event_time(lambda: None) == Unavailable(reason)


@pytest.mark.parametrize("per_call_s", [2.0**-10, 2.0**-7])
def test_wall_time_reports_the_time_per_call_its_clock_measured(per_call_s) -> None:
    clock, calls = FakeClock(), []

    def call() -> None:
        calls.append(1)
        clock.advance(per_call_s)

    # torch's own Timer, reading the fake clock: each call costs exactly per_call_s (powers of two stay exact).
    min_run_time = 2.0**-5
    result = wall_time(call, warmup=3, min_run_time=min_run_time, clock=clock)
    assert isinstance(result, WallTiming)
    assert result.median_s == per_call_s
    assert result.iqr_s == 0.0  # every block took the same time
    assert result.num_threads == torch.get_num_threads()
    # The timed blocks fill min_run_time of the clock; warm-up calls come on top (and the Timer's sizing calls).
    assert result.blocks * result.calls_per_block * per_call_s >= min_run_time
    assert len(calls) >= 3 + result.blocks * result.calls_per_block


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"warmup": -1}, "warmup must be an int >= 0, got -1"),
    ({"min_run_time": 0}, "min_run_time must be a number of seconds > 0, got 0"),
    ({"min_run_time": "1"}, "min_run_time must be a number of seconds > 0, got '1'"),
])
def test_wall_time_rejects_bad_arguments(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        wall_time(lambda: None, **kwargs)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_real_cuda_event_time_measures_device_work() -> None:
    a = torch.randn(2048, 2048, device="cuda")
    result = cuda_event_time(lambda: a @ a, calls=5, warmup=2)
    assert isinstance(result, CudaEventTiming)
    assert len(result.times_ms) == 5
    assert all(t > 0 for t in result.times_ms)


def test_blocked_speedup_runs_one_case_per_block_and_takes_the_median_of_block_pairs():
    from pitfalls.probes import blocked_speedup

    calls: list[tuple[str, int]] = []
    base = iter([0.020, 0.022, 0.090])  # the third baseline block was disturbed: the median ignores it
    cand = iter([0.010, 0.011, 0.010])

    def baseline(count: int) -> float:
        calls.append(("a", count))
        return next(base)

    def candidate(count: int) -> float:
        calls.append(("b", count))
        return next(cand)

    result = blocked_speedup(baseline, candidate, blocks=3, calls=4, seconds=0)
    assert calls == [("a", 4), ("b", 4)] * 3
    assert result.ratios == pytest.approx((2.0, 2.0, 9.0)) and result.ratio == pytest.approx(2.0)
    assert result.rounds == 3
    assert (result.baseline_median_s, result.candidate_median_s) == (0.022, 0.010)
    with pytest.raises(ValueError, match="block 0 reported a non-positive time"):
        blocked_speedup(lambda n: 0.0, lambda n: 0.01, blocks=1)


def test_blocked_speedup_times_more_pairs_within_its_seconds_and_stops_at_max_blocks():
    from pitfalls.probes import blocked_speedup

    now = [0.0]
    calls = []

    def clock() -> float:
        return now[0]

    def block(name: str):
        def timed(count: int) -> float:
            calls.append(name)
            now[0] += 0.25  # each block takes a quarter of a second on the fake clock
            return 0.02 if name == "a" else 0.01
        return timed

    # 5 pairs take 2.5 s: the budget of 4 s asks for pairs until 4 s have passed (8 pairs).
    result = blocked_speedup(block("a"), block("b"), blocks=5, seconds=4.0, clock=clock)
    assert result.rounds == 8 and result.ratio == pytest.approx(2.0)
    assert calls == ["a", "b"] * 8
    # Long blocks: the budget is spent before the minimum, which still holds.
    now[0], calls[:] = 0.0, []
    assert blocked_speedup(block("a"), block("b"), blocks=5, seconds=1.0, clock=clock).rounds == 5
    # Instant blocks stop at max_blocks.
    frozen = blocked_speedup(lambda n: 0.02, lambda n: 0.01, blocks=2, seconds=10.0, max_blocks=7, clock=lambda: 0.0)
    assert frozen.rounds == 7
    with pytest.raises(ValueError, match="seconds=-1 is not allowed"):
        blocked_speedup(lambda n: 0.02, lambda n: 0.01, seconds=-1)
    with pytest.raises(ValueError, match="max_blocks"):
        blocked_speedup(lambda n: 0.02, lambda n: 0.01, blocks=5, max_blocks=4)

"""The loader's steady-state timing and its calibration rows: planted producers and consumers (sleeps) through the
loader's own code path, and the old timings (a pre-filled queue, both loaders live) caught failing."""

from __future__ import annotations

import time

import psutil
import pytest

from pitfalls.families import loader
from pitfalls.families.loader import steady
from pitfalls.families.loader import timing_checks as calibration
from pitfalls.known.table import verdict
from pitfalls.probes.timing import interleaved_speedup

# Timing and memory figures read against planted values: with the machine to themselves.
pytestmark = pytest.mark.serial

CHECKS = {check.name: check for check in loader.FAMILY.calibrations}


def alive(pids):
    living = []
    for pid in pids:
        try:  # a worker may finish exiting between two calls: gone, not alive
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                living.append(pid)
        except psutil.NoSuchProcess:
            pass
    return living


def test_the_batches_made_in_advance_are_workers_times_prefetch_plus_one_each():
    assert steady.prefilled(0, 2) == 0
    assert steady.prefilled(2, 2) == 6
    assert steady.batches_to_time(2, 2) == (6, 60)
    assert steady.batches_to_time(0, 2, calls=3) == (0, steady.MIN_BATCHES)
    assert steady.batches_to_time(1, 2, calls=100) == (3, 100)


def test_a_steady_run_discards_times_and_leaves_no_worker_behind():
    step = calibration.planted_step(2, per_item_ms=0.5, step_ms=0.5)
    try:
        step()
        pids = step.worker_pids()
        assert len(alive(pids)) == 2
        run = steady.run(step, min_seconds=0.0)
        assert (run.discarded, run.batches, run.samples) == (6, 60, 60 * step.params["batch"])
        assert step.board.batches_made() >= 2 + 6 + 60  # the board is shared by every start of the loader
        assert alive(pids) == [] and alive(step.worker_pids()) == []
        assert step() is not None  # the next call starts afresh
    finally:
        step.close()


def test_a_loader_case_has_a_block_that_returns_seconds_per_batch(data_cache_dir):
    with loader.FAMILY.build("uint8", num_workers=1, **loader.FAMILY.smoke) as case:
        assert case.block is not None
        assert case.block(1) > 0
        assert case.call.iterator is None  # nothing prefetches after a block


@pytest.fixture
def data_cache_dir(tmp_path, monkeypatch):
    from pitfalls.families.loader.data import CACHE_ENV

    monkeypatch.setenv(CACHE_ENV, str(tmp_path))


def test_consumer_bound_throughput_never_reads_above_what_the_consumer_allows():
    # Wake-up latency on a loaded machine can only make the consumer slower than planted, never faster.
    reading = calibration.throughput(2, "consumer", "cpu")
    assert reading.measured <= reading.planted * 1.10, reading


def _pre_steady_samples_per_second(step):
    """The routine before steady state: the case idles while its workers fill the queue, then >= 1 s, >= 3 batches."""
    # DataLoader asks its workers for prefetch_factor batches each ahead of the consumer: the queue is full when
    # they are made (`steady.prefilled` also counts one per worker in collation, an upper bound it need not reach).
    step.start()
    deadline = time.monotonic() + 60
    full = step.prefetching_workers * step.params["prefetch_factor"]
    while step.board.batches_made() < full and time.monotonic() < deadline:
        time.sleep(0.05)
    started, batches = time.perf_counter(), 0
    while batches < 3 or time.perf_counter() - started < 1.0:
        step()
        batches += 1
    return batches * step.params["batch"] / (time.perf_counter() - started)


def test_the_row_fails_on_a_timing_that_counts_the_prefilled_queue():
    # Whatever the load, the batches made while the case idled come free: the old timing reads above the planted
    # rate, which no steady-state reading can (the producers allow no more).
    check = CHECKS["loader samples/s: W=4, producer-bound"]
    mutated = verdict(check, calibration.throughput(4, "producer", "cpu", timing=_pre_steady_samples_per_second))
    assert mutated.verdict == "fail" and mutated.measured > mutated.planted * 1.10, mutated


def _both_live(baseline, candidate):
    """The speedup before blocks: calls alternate while both loaders' workers keep prefetching."""
    return interleaved_speedup(baseline, candidate, rounds=10, warmup=1).ratio


def test_the_speedup_row_fails_with_both_loaders_live():
    check = CHECKS["loader speedup: producer 2p against p, W=2"]
    mutated = verdict(check, calibration.known_speedup("cpu", compare=_both_live))
    assert mutated.verdict == "fail", mutated  # read 1.67 and 6.6 here: interleaving live queues is arbitrary


def test_every_row_names_the_loader_and_an_instrument_the_family_publishes():
    timing = {check.name: check for check in calibration.CHECKS}
    # 4 worker counts x 2 sides, 2x, itself at W=0 and 2, the wait share and the crossover at W=0 and 2
    assert len(timing) == 15 and set(timing) <= set(CHECKS)
    assert {key for check in timing.values() for key in check.instruments} == {
        calibration.SAMPLES_PER_SECOND, "speedup", calibration.WAIT_SHARE, calibration.STARVES_BELOW}
    assert all(check.family == "loader" for check in CHECKS.values())


def test_the_steady_routine_discards_then_splits_wait_from_delivery():
    made: list[int] = []

    def batches():
        for index in range(10_000):
            time.sleep(0.004)  # planted: 4 ms waiting for each batch
            made.append(index)
            yield index

    delivered: list[int] = []

    def deliver(batch):
        time.sleep(0.012)  # planted: 12 ms in the step
        delivered.append(batch)

    discard = steady.prefilled(2, 2)
    run = steady.steady_state(batches, deliver, lambda _batch: 3, discard=discard, min_seconds=0.0)
    assert discard == 6 and run.discarded == 6 and run.batches == 60 and run.samples == 180
    assert len(made) == len(delivered) == 66  # the discarded batches were delivered too, untimed
    assert run.wait_share == pytest.approx(0.25, abs=0.08)
    assert run.samples_per_second == pytest.approx(3 / 0.016, rel=0.25)

"""The loader's verdict (wait share, the step cost below which the loader starves the device), its planted step
cost (``model_ms``) and its epoch starts (persistent_workers off and on)."""

from __future__ import annotations

import dataclasses
import os
import time
from functools import partial
from typing import Any

import pytest
import torch
from torch.utils.data import Dataset, default_collate

from pitfalls.families.loader import ENTRY, FAMILY, epochs, probes, steady, stepcost, timing_checks
from pitfalls.families.loader import verdict as loader_verdict
from pitfalls.families.loader.steps import LoaderStep, make_step
from pitfalls.families.loader.verdict import WAIT_THRESHOLD, judge
from pitfalls.family import FLOOR, SkipCase
from pitfalls.known import other_work
from pitfalls.known.one_run import OneRun
from pitfalls.known.table import verdict as judged_row
from pitfalls.result import Unavailable

QUICK = {"image_size": 32, "batch": 8, "items": 32}


def steady_run(batches: int, wait_s: float, step_s: float) -> steady.Steady:
    return steady.Steady(discarded=1, batches=batches, samples=4 * batches, seconds=wait_s + step_s, wait_s=wait_s,
                         step_s=step_s, first_batch_s=0.1)


def test_without_workers_the_crossover_is_where_the_loading_time_is_the_threshold_share() -> None:
    # 10 batches, each 30 ms loading then 70 ms step: share 0.3; loading and the step take turns, so the share is
    # 10 % at a step of 30 x 9 = 270 ms.
    found = judge(steady_run(10, 0.3, 0.7), workers=0)
    assert found.wait_share == pytest.approx(0.3)
    assert found.bound == "loader-bound" and found.margin == pytest.approx(0.3 - WAIT_THRESHOLD)
    assert found.starves_below_s == pytest.approx(0.030 * (1 - WAIT_THRESHOLD) / WAIT_THRESHOLD)


def test_with_workers_a_loader_bound_run_gives_the_workers_pace() -> None:
    # A period of 100 ms of which 40 ms waiting: the workers deliver a batch every 100 ms, so a step shorter than
    # 90 ms waits more than 10 %.
    found = judge(steady_run(10, 0.4, 0.6), workers=2)
    assert found.bound == "loader-bound"
    assert found.starves_below_s == pytest.approx(0.090)
    assert "loader-bound" in found.describe() and "90 ms" in found.describe()


def test_with_workers_a_step_bound_run_has_no_crossover_to_read() -> None:
    found = judge(steady_run(10, 0.02, 0.98), workers=2)
    assert found.bound == "step-bound" and found.margin < 0
    below = found.starves_below_s
    assert isinstance(below, Unavailable) and "smaller model_ms" in below.reason


def test_a_run_with_no_batch_has_no_verdict() -> None:
    with pytest.raises(ValueError, match="no batch was timed"):
        judge(dataclasses.replace(steady_run(0, 0.0, 0.0), seconds=0.0, short="the epoch ended"), workers=0)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_gpu_loop_is_sized_from_the_time_of_its_products() -> None:
    clock = FakeClock()
    ran: list[int] = []

    def run(products: int) -> None:  # a device on which a product takes 0.25 ms
        ran.append(products)
        clock.now += products * 0.00025

    size = stepcost.size_loop(0.020, run, sync=lambda: None, clock=clock, probe=40)
    assert size.products == 80 and size.seconds_per_product == pytest.approx(0.00025)
    assert size.seconds == pytest.approx(0.020)
    assert ran == [40, 40]  # a warm-up, then the timed run


def test_a_clock_that_does_not_advance_sizes_nothing() -> None:
    with pytest.raises(RuntimeError, match="did not advance"):
        stepcost.size_loop(0.010, lambda n: None, sync=lambda: None, clock=FakeClock())


def test_the_matmul_loop_runs_the_products_it_was_sized_for() -> None:
    # The GPU's code path on the CPU device: sized by timing its own products, synchronized (a no-op here).
    loop = stepcost.MatmulLoop(0.005, torch.device("cpu"), side=32)
    assert loop.size.products >= 1
    counted: list[int] = []
    loop.run = counted.append  # type: ignore[method-assign]
    loop()
    assert counted == [loop.size.products]


def test_the_cpu_busy_step_lasts_until_its_deadline() -> None:
    clock = FakeClock()

    def ticking() -> float:  # each look at the clock takes 1 ms
        clock.now += 0.001
        return clock.now

    busy = stepcost.BusyFor(0.010, clock=ticking)
    busy()
    assert busy.spins == 9 and clock.now == pytest.approx(0.011)


def test_no_planted_cost_is_the_model_step_alone() -> None:
    assert stepcost.planted_cost(0, torch.device("cpu")) is None
    assert isinstance(stepcost.planted_cost(3, torch.device("cpu")), stepcost.BusyFor)


def test_model_ms_adds_its_planted_time_to_each_step() -> None:
    """Delivery only (no model step): a step with model_ms takes the planted time more per batch than without."""
    planted_ms = 20

    def step_per_batch(model_ms: int) -> float:
        where, params = ENTRY.place("uint8", "cpu", {**QUICK, "model_step": False, "model_ms": model_ms})
        step = make_step("uint8", where, params)
        try:
            run = steady.run(step, min_seconds=0.2)
        finally:
            step.close()
        return run.step_s / run.batches

    added = step_per_batch(planted_ms) - step_per_batch(0)
    # The copy and normalize of a batch are on both sides; a shared machine that preempts the busy loop past its
    # deadline adds to it: read 1.01-1.11 here at load 4-10, 1.54 once at load 8 beside an asv run.
    assert 0.95 <= added / (planted_ms / 1000) < 1.6, added


WAIT_CHECKS = [c for c in timing_checks.CHECKS if c.name.startswith("loader wait share")]


def test_the_wait_share_is_a_calibrated_figure_of_the_family() -> None:
    assert {c.name for c in WAIT_CHECKS} == {"loader wait share: W=0, producer-bound",
                                            "loader wait share: W=2, producer-bound"}
    assert set(WAIT_CHECKS) <= set(FAMILY.calibrations)


# That both rows read their planted ratio is test_calibrate's (every CPU row of `pitfalls calibrate` passes, with the
# machine to itself); here, the fault each must catch.


def test_a_wait_share_that_swaps_the_wait_and_the_step_fails_its_row() -> None:
    """The fault the row must catch: the two halves of each batch's time read the wrong way round."""
    def swapped(step: Any) -> steady.Steady:
        run = steady.run(step)
        return dataclasses.replace(run, wait_s=run.step_s, step_s=run.wait_s)

    check = next(c for c in WAIT_CHECKS if "W=0," in c.name)
    row = judged_row(check, timing_checks.wait_share(0, "cpu", judge=partial(timing_checks.judged, run=swapped)))
    assert row.verdict == "fail", row


STARVE_CHECKS = [c for c in timing_checks.CHECKS if c.name.startswith("loader starves below")]


def test_the_crossover_is_a_calibrated_figure_of_the_family() -> None:
    # That both rows read their planted step cost is test_calibrate's, as for the wait share.
    assert {c.name for c in STARVE_CHECKS} == {"loader starves below: W=0, producer-bound",
                                              "loader starves below: W=2, producer-bound"}
    assert set(STARVE_CHECKS) <= set(FAMILY.calibrations)
    assert FAMILY.benchmark_figures["track_starves_below"] == loader_verdict.STARVES_BELOW


def test_the_samples_per_second_wait_share_and_crossover_rows_read_one_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """A producer-bound pair's three rows read one steady run, as a case's samples/s and verdict do; a row read
    again gets a run of its own."""
    runs: list[tuple[int, str]] = []

    def planted(workers: int, device: str) -> steady.Steady:
        runs.append((workers, device))
        # 10 batches of 4 in 1.5 s, 1.0 s of it waiting: the W=0 pair's planted 26.7 samples/s and share 0.667.
        return steady_run(10, 1.0, 0.5)

    monkeypatch.setattr(timing_checks, "producer_bound", planted)
    monkeypatch.setattr(other_work, "WAIT_S", 0.0)  # nothing is timed: no wait for free cores
    monkeypatch.setattr(timing_checks, "_PRODUCER_BOUND", OneRun(timing_checks._producer_bound_alone))
    names = ("loader samples/s: W=0, producer-bound", "loader wait share: W=0, producer-bound",
             "loader starves below: W=0, producer-bound")
    checks = {c.name: c for c in timing_checks.CHECKS}
    rate, share, crossover = (judged_row(checks[name], checks[name].measure("cpu")) for name in names)
    assert runs == [(0, "cpu")]
    assert rate.measured == pytest.approx(40 / 1.5) and rate.verdict == "pass", rate
    assert share.measured == pytest.approx(1.0 / 1.5) and share.verdict == "pass", share
    assert crossover.measured == pytest.approx(judge(steady_run(10, 1.0, 0.5), 0).starves_below_s * 1e3)
    judged_row(checks[names[0]], checks[names[0]].measure("cpu"))
    assert runs == [(0, "cpu"), (0, "cpu")]
    # Every other pair is timed by its own row.
    consumer = checks["loader samples/s: W=0, consumer-bound"]
    assert consumer.measure.func is timing_checks._throughput_on and "consumer" in consumer.measure.args


def test_a_crossover_read_as_the_workers_pace_without_workers_fails_its_row() -> None:
    """The fault the row must catch: the with-workers formula, (1 - t) times the period, where loading and the
    step take turns (then the wait is the loading whatever the step, and the crossover nine times it)."""
    def as_if_overlapped(workers: int, device: str) -> loader_verdict.Verdict:
        return dataclasses.replace(timing_checks.judged(workers, device), workers=1)

    check = next(c for c in STARVE_CHECKS if "W=0," in c.name)
    row = judged_row(check, timing_checks.starves_below(0, "cpu", judge=as_if_overlapped))
    assert row.verdict == "fail" and row.measured < 0.5 * row.planted, row


def test_the_verdict_is_among_the_familys_own_figures() -> None:
    case = FAMILY.build("uint8", image_size=8, batch=4, items=8)
    try:
        figures = {name: value for name, value, *_ in probes.own_figures(case)}
    finally:
        case.close()
    assert 0.0 <= figures["wait share in next()"] <= 1.0
    assert figures["starves the device below"] > 0  # no workers: always a crossover
    assert figures["epoch start, persistent_workers off"] > 0
    assert isinstance(figures["epoch start, persistent_workers on"], Unavailable)


START_S = 0.3


class SlowStart(Dataset[Any]):
    """A planted worker start: the first item a process reads sleeps ``START_S``, every later one nothing."""

    def __init__(self, items: int) -> None:
        self.items = items
        self.started_in: int | None = None

    def __len__(self) -> int:
        return self.items

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.started_in != os.getpid():
            time.sleep(START_S)
            self.started_in = os.getpid()
        return torch.zeros(3, 8, 8, dtype=torch.uint8), torch.zeros(8, 8, dtype=torch.uint8)


def test_new_workers_pay_their_start_again_and_persistent_ones_do_not() -> None:
    params = ENTRY.resolve({**ENTRY.smoke, "image_size": 8, "num_workers": 2, "items": 16, "batch": 4})
    step = LoaderStep("uint8", torch.device("cpu"), params, start=False, source=(SlowStart(16), default_collate))

    def deliver(batch: Any) -> None:
        step.deliver(batch)

    try:
        fresh = epochs.epoch_start(epochs.one_epoch_loader(step, persistent=False), deliver)
        kept = epochs.epoch_start(epochs.one_epoch_loader(step, persistent=True), deliver)
    finally:
        step.close()
    # New workers sleep START_S before their first item (plus a fork); the persistent ones read at once.
    assert kept < START_S / 2, kept
    assert 1.0 <= (fresh - kept) / START_S < 2.0, (fresh, kept)


def test_epoch_starts_without_workers_or_a_loader() -> None:
    starts = epochs.epoch_starts("uint8", "cpu", image_size=8, batch=4, items=8)
    assert starts.fresh > 0 and isinstance(starts.persistent, Unavailable)
    with pytest.raises(SkipCase, match="no loader"):
        epochs.epoch_starts(FLOOR, "cpu", image_size=8, batch=4, items=8)


def cow(window: tuple[int, ...], items: int = 64) -> probes.CopyOnWrite:
    return probes.CopyOnWrite(window=window, items_read=items)


def test_a_copy_on_write_growth_below_the_noise_floor_is_na() -> None:
    floor = probes.COW_NOISE_FLOOR_BYTES
    shrank = cow((-46 * 1024 * 32, 300 * 1024)).per_item  # the committed -46 KiB/item: one worker's heap shrank
    assert isinstance(shrank, Unavailable) and "noise floor" in shrank.reason
    assert isinstance(cow((floor - 1, floor)).per_item, Unavailable)
    assert cow((floor, floor)).per_item == 2 * floor / 64


def test_workers_that_copy_nothing_read_na_not_a_number() -> None:
    """A planted data set whose reads write nothing, through the figure's own reading: no copy to report."""
    from pitfalls.families.loader import memory_checks

    step = memory_checks.planted_step(memory_checks.CopiedPerRead(64, 0, reads=3 * 64), 2, measure_uss=True)
    try:
        growth = probes.copy_on_write_of(step, epochs=1)
    finally:
        step.close()
    assert growth.items_read > 0
    assert isinstance(growth.per_item, Unavailable), growth


# A planted time read against its plan: in the serial phase, where no other test shares the cores (a 2 ms step
# read 5.2 ms, a median, beside the parallel phase's tests).
@pytest.mark.serial
def test_the_gpu_runs_step_cost_piece_reads_the_planted_step_and_the_verdict_with_it() -> None:
    """At the rehearsal's sizes: the clock spin (on a GPU, the sized matmul loop) against its planted time, then
    verdicts."""
    from pitfalls.gpu_run.checks import loader_step_cost
    from pitfalls.gpu_run.sizes import REHEARSAL

    rows = loader_step_cost("cpu", REHEARSAL)
    timed = [r for r in rows if "ratio" in r]
    assert [r["model_ms"] for r in timed] == [2, 10, 50]
    # A deadline cannot end early; a loaded machine can preempt a call past its end (medians seen here: up to 1.05;
    # means up to 1.53 at load 8).
    assert all(1.0 <= r["ratio"] < 1.3 for r in timed), timed
    judged = {r["variant"]: r["verdict"] for r in rows if "variant" in r}
    assert set(judged) == {"naive", "uint8"} and all("bound" in v for v in judged.values()), judged

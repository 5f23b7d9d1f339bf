"""The loader's batch-size and start figures, calibrated on planted answers through the published figures' own
routines (`flight_checks`, `start_checks`); a planted fault in each instrument fails its row."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Iterable
from typing import Any

import pytest
from torch.utils.data import DataLoader

from pitfalls.families.loader import FAMILY, epochs, flight_checks, probes, start_checks
from pitfalls.families.loader.probes import InFlight
from pitfalls.families.loader.steps import LoaderStep
from pitfalls.families.loader.workers import shut_down
from pitfalls.known.table import Check, Row, own_instrument, verdict
from pitfalls.probes.group_memory import shm_segments

# Timing and shared-memory figures read against planted values: with the machine to themselves (`serial`), all but
# the one whose fault other work cannot hide (below).
pytestmark = pytest.mark.slow

NEW_CHECKS = (*flight_checks.CHECKS, *start_checks.CHECKS)


def rows(checks: Iterable[Check]) -> list[Row]:
    return [verdict(check, check.measure("cpu")) for check in checks]


def named(checks: Iterable[Check], fragment: str) -> Check:
    (check,) = [c for c in checks if fragment in c.name]
    return check


@pytest.mark.serial
def test_every_new_check_is_the_familys_and_names_a_figure_it_publishes() -> None:
    assert set(NEW_CHECKS) <= set(FAMILY.calibrations)
    assert len({c.name for c in FAMILY.calibrations}) == len(FAMILY.calibrations)
    case = FAMILY.build("uint8", image_size=8, batch=4, items=8)
    try:
        published = {own_instrument("loader", name) for name, *_ in probes.own_figures(case)}
    finally:
        case.close()
    read = {instrument for check in NEW_CHECKS for instrument in check.instruments}
    assert read <= published, read - published
    # Each asv method that publishes one of these figures is mapped to it, so the report marks it calibrated.
    figures = {probes.BYTES_PER_BATCH, probes.BATCHES_IN_FLIGHT, probes.BYTES_IN_FLIGHT, probes.TIME_TO_FIRST_BATCH,
                probes.EPOCH_START_FRESH, probes.EPOCH_START_PERSISTENT}
    assert {own_instrument("loader", f) for f in figures} == read
    assert figures <= set(FAMILY.benchmark_figures.values())


# --- in flight --------------------------------------------------------------------------------------------------


@pytest.mark.serial
def test_the_in_flight_rows_read_their_exact_answers_from_one_run() -> None:
    run = flight_checks.FlightRun()
    judged = rows(flight_checks.flight_checks(run))
    assert [r.verdict for r in judged] == ["pass"] * 3, judged
    assert [r.measured for r in judged] == [16384, 4, 65536], judged


def article_arithmetic(step: LoaderStep) -> InFlight:
    """The article's count: one batch per worker, so workers x batch bytes in flight."""
    got = probes.in_flight_of(step)
    return dataclasses.replace(got, batches=got.workers, measured_bytes=got.article_bytes)


def main_process_only(pids: Iterable[int]) -> dict[int, int]:
    """A segment reader that looks in the main process alone: the batches the workers still hold are missed."""
    del pids
    return shm_segments([os.getpid()])


def main_only_in_flight(step: LoaderStep) -> InFlight:
    return probes.in_flight_of(step, segments=main_process_only)


@pytest.mark.serial
def test_in_flight_counted_with_the_articles_arithmetic_fails_both_rows() -> None:
    checks = flight_checks.flight_checks(flight_checks.FlightRun(article_arithmetic))
    judged = {r.check: r for r in rows(checks[1:])}
    assert [r.verdict for r in judged.values()] == ["fail", "fail"], judged
    assert [r.measured for r in judged.values()] == [2, 32768], judged


@pytest.mark.serial
def test_segments_of_the_main_process_alone_fail_the_bytes_row() -> None:
    check = named(flight_checks.flight_checks(flight_checks.FlightRun(main_only_in_flight)), "bytes in flight")
    row = verdict(check, check.measure("cpu"))
    # At rest the workers hold the batches made ahead: the main process holds at most those it took out of turn.
    assert row.verdict == "fail" and row.measured is not None and row.measured <= row.planted / 2, row


@pytest.mark.serial
def test_bytes_per_batch_counted_as_float32_elements_fails_its_row(monkeypatch: pytest.MonkeyPatch) -> None:
    # The article's size of a batch: 4 bytes an element, whatever the tensors handed over hold (uint8 here).
    monkeypatch.setattr(probes, "nbytes", lambda batch: sum(t.nelement() * 4 for t in batch))
    check = named(flight_checks.flight_checks(flight_checks.FlightRun()), "bytes per batch")
    row = verdict(check, check.measure("cpu"))
    assert row.verdict == "fail" and row.measured == 4 * row.planted, row


@pytest.mark.serial
def test_a_started_step_is_refused_by_the_start_and_flight_figures() -> None:
    step = flight_checks.planted_step()
    try:
        step.start()
        with pytest.raises(ValueError, match="start=False"):
            probes.in_flight_of(step)
        with pytest.raises(ValueError, match="start=False"):
            probes.time_to_first_batch_of(step)
    finally:
        step.close()


# --- starts -----------------------------------------------------------------------------------------------------


# That each start row reads its plant is `tests/test_calibrate.py`'s (every CPU row of the command passes); here,
# the faults each must catch.


def timed_once_the_workers_run(step: LoaderStep) -> float:
    """A time to first batch that starts its clock once the workers are up and have made their first batches."""
    step.start()
    deadline = time.monotonic() + 30
    while step.board.batches_made() < start_checks.WORKERS and time.monotonic() < deadline:
        time.sleep(0.005)
    began = time.perf_counter()
    step()
    return time.perf_counter() - began


@pytest.mark.serial
def test_time_to_first_batch_timed_once_the_workers_run_fails_its_row() -> None:
    reading = start_checks.first_batch("cpu", first=timed_once_the_workers_run)
    row = verdict(named(start_checks.CHECKS, "time to first batch"), reading)
    assert row.verdict == "fail" and row.measured is not None and row.measured < row.planted / 2, row


def from_the_second_batch(loader: DataLoader[Any], deliver: Callable[[Any], object]) -> float:
    """An epoch start timed from the next epoch's first batch delivered to its second."""
    iterator = iter(loader)
    try:
        for batch in iterator:
            deliver(batch)
        iterator = iter(loader)
        deliver(next(iterator))
        began = time.perf_counter()
        deliver(next(iterator))
        return time.perf_counter() - began
    finally:
        shut_down(iterator)


@pytest.mark.serial
def test_an_epoch_start_timed_from_the_second_batch_fails_the_fresh_row(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(epochs, "epoch_start", from_the_second_batch)
    check = named(start_checks.start_checks(start_checks.EpochRun()), "persistent off")
    row = verdict(check, check.measure("cpu"))
    assert row.verdict == "fail" and row.measured is not None and row.measured < row.planted / 2, row


# Not serial: the fault reads the planted 600 ms where 0 was planted, and other work on the machine can only add to
# an epoch's start, never hide it: the row fails on a busy machine as on a quiet one (it takes 13 s, almost all of
# them the planted sleeps, so it costs the parallel phase little).
def test_persistent_workers_restarted_each_epoch_fail_the_persistent_row(monkeypatch: pytest.MonkeyPatch) -> None:
    real = epochs.one_epoch_loader

    def never_persistent(step: LoaderStep, *, persistent: bool) -> DataLoader[Any]:
        del persistent
        return real(step, persistent=False)

    monkeypatch.setattr(epochs, "one_epoch_loader", never_persistent)
    check = named(start_checks.start_checks(start_checks.EpochRun()), "persistent on")
    row = verdict(check, check.measure("cpu"))
    # New workers sleep again at their first item: the row reads about the plant, where 0 was planted.
    assert row.verdict == "fail" and row.measured is not None and row.measured > start_checks.DELAY_MS / 2, row

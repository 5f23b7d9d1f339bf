"""The loader's memory figures: the group's peak, copy-on-write per item, the workers' growth over an epoch; each
calibrated on a planted answer through the loader's own code, and each mutation of the instruments caught."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pitfalls.families.loader import FAMILY, metadata, probes
from pitfalls.families.loader import memory_checks as calibrations
from pitfalls.known.table import verdict
from pitfalls.probes import group_memory
from pitfalls.result import Unavailable

# Memory figures read against planted values: with the machine to themselves.
pytestmark = [pytest.mark.slow, pytest.mark.serial]

CHECKS = {check.name: check for check in calibrations.CHECKS}
ROOT = Path(__file__).resolve().parents[1]


def check_named(prefix: str) -> Any:
    (check,) = [c for name, c in CHECKS.items() if name.startswith(prefix)]
    return check


def test_every_memory_check_is_the_familys_and_names_a_figure_it_publishes() -> None:
    assert set(calibrations.CHECKS) <= set(FAMILY.calibrations)
    figure_names = {calibrations.PEAK_PSS, calibrations.PEAK_USS, calibrations.COPIED_PER_ITEM}
    case = FAMILY.build("uint8", image_size=8, batch=4, items=8)
    try:
        own = {name for name, *_ in probes.own_figures(case)}
    finally:
        case.close()
    assert figure_names <= own


# That each memory row reads its planted answer is tests/test_calibrate.py's (every CPU row of the command passes,
# in one run of the whole table); here, the faults each must catch.


def test_the_metadata_rows_read_the_figures_the_benchmark_publishes() -> None:
    published = {FAMILY.benchmark_figures[m]
                 for m in ("track_worker_growth", "track_group_uss", "track_group_pss", "track_table")}
    for prefix in ("loader: metadata growth", "loader: metadata group USS", "loader: metadata group PSS",
                   "loader: metadata table"):
        check = check_named(prefix)
        assert check in FAMILY.calibrations
        (instrument,) = check.instruments
        assert instrument.removeprefix("loader: ") in published


def test_a_group_memory_of_the_main_process_or_of_the_workers_alone_fails_the_metadata_rows() -> None:
    # The epochs the rows read (`memory_checks.EPOCHS`): the faults are in how the group is summed.
    uss, pss = check_named("loader: metadata group USS"), check_named("loader: metadata group PSS")
    parent = verdict(uss, calibrations.metadata_reading(lambda e: e.parent_uss, uss.measure("cpu").planted,
                                                        calibrations.EPOCHS.reader("the main process alone")))
    assert parent.verdict == "fail" and parent.measured < 0.5 * parent.planted, parent
    # The workers' PSS alone leaves out the main process's original and its share of the buffer no one wrote.
    workers = verdict(pss, calibrations.metadata_reading(lambda e: sum(e.worker_pss), pss.measure("cpu").planted,
                                                         calibrations.EPOCHS.reader("the workers alone")))
    assert workers.verdict == "fail" and workers.measured < 0.8 * workers.planted, workers


def per_reference(records: metadata.ObjectRecords) -> int:
    """The table's bytes with an object counted at every reference to it."""

    def size(value: Any) -> int:
        inner = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
        return sys.getsizeof(value) + sum(size(part) for part in inner)

    return size(records.records)


def records_alone(records: metadata.ObjectRecords) -> int:
    """The table's bytes without the objects its records hold: the list and the record dicts."""
    return sys.getsizeof(records.records) + sum(sys.getsizeof(record) for record in records.records)


@pytest.mark.parametrize(("walker", "off_by"), [(per_reference, 2.0), (records_alone, 0.0)])
def test_a_table_that_counts_an_object_twice_or_misses_what_records_hold_fails_its_row(
        monkeypatch: pytest.MonkeyPatch, walker: Any, off_by: float) -> None:
    monkeypatch.setattr(metadata.ObjectRecords, "nbytes", property(walker))
    row = verdict(check_named("loader: metadata table"), check_named("loader: metadata table").measure("cpu"))
    assert row.verdict == "fail" and row.measured == pytest.approx(off_by * row.planted, rel=0.01), row


def parent_only(root_pid: int) -> list[group_memory.MemberSample]:
    """A process table that sees the main process and none of its workers: the fault the row must catch."""
    return [sample for sample in group_memory.group_members(root_pid) if sample.pid == os.getpid()]


def test_a_group_memory_that_counts_only_the_parent_fails_its_row(monkeypatch: pytest.MonkeyPatch) -> None:
    # The group's members come from `members_named`: the fault is a table of the parent alone.
    monkeypatch.setattr(probes, "members_named", lambda pids: parent_only)
    check = check_named("loader: group peak")
    row = verdict(check, check.measure("cpu"))
    assert row.verdict == "fail" and row.measured is not None and row.measured < 0.5 * row.planted, row


@dataclasses.dataclass(frozen=True)
class DividesByAtLeastOne(probes.CopyOnWrite):
    """The old figure: growth over max(items read, 1), which reads 0.0 when nothing was read."""

    @property
    def per_item(self) -> float:  # type: ignore[override]
        return sum(self.window) / max(self.items_read, 1)


def no_figure_without_reads(kind: type[probes.CopyOnWrite]) -> None:
    """What every copy-on-write figure must do when the window read nothing: say n/a, not 0."""
    nothing = kind(window=(0, 0), items_read=0)
    assert isinstance(nothing.per_item, Unavailable), nothing.per_item


# The copy-on-write row as asv measures it: in a process that has just imported the suite (asv's benchmark process
# is forked from a server that discovered every benchmark), with many young objects pending for the collector.
IN_ASV_S_PROCESS = """
import sys
from asv_runner._aux import update_sys_path
from asv_runner.discovery import disc_benchmarks
update_sys_path(sys.argv[1])
for _ in disc_benchmarks(sys.argv[1], ignore_import_errors=False):
    pass
from pitfalls.calibration.published import measured_error
print(measured_error(sys.argv[2], "cpu"))
"""


def test_the_copy_on_write_row_reads_its_answer_in_a_process_that_has_just_imported_the_suite() -> None:
    # Without a full collection before the workers fork, each worker's first one fell in the window and copied the
    # pages of the containers it inherited: the row read 53-56 % high there, every time (3 % from the command line).
    name = check_named("loader: copy-on-write").name
    done = subprocess.run([sys.executable, "-c", IN_ASV_S_PROCESS, str(ROOT / "benchmarks"), name],
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert float(done.stdout.split()[-1]) < check_named("loader: copy-on-write").tolerance, done.stdout


def test_copy_on_write_with_nothing_read_is_na_and_the_old_formula_is_caught() -> None:
    no_figure_without_reads(probes.CopyOnWrite)
    with pytest.raises(AssertionError):
        no_figure_without_reads(DividesByAtLeastOne)
    read = probes.CopyOnWrite(window=(8 << 20,), items_read=2048)
    assert read.per_item == 4096


def test_the_peak_is_the_whole_groups_and_sampled_during_the_run() -> None:
    step = calibrations.planted_step(calibrations.HeldPerWorker(32, 16), workers=2)
    try:
        peak = probes.group_peak(step, batches=8)
    finally:
        step.close()
    assert peak.peak_processes == 3 and peak.samples >= 2
    assert {p.pid for p in peak.processes} >= {os.getpid()}
    # Each worker's own peak holds its planted 16 MiB.
    workers = [p for p in peak.processes if p.pid != os.getpid()]
    assert len(workers) == 2 and all(p.uss > 16 << 20 for p in workers)

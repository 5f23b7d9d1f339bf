"""`pitfalls calibrate`: the real command passes on every CPU row; planted faults in the instruments make it fail;
a timed row waits for planted leftover work to be gone."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from pitfalls.calibration import figure_checks as shared
from pitfalls.calibration.run import all_checks, run_checks
from pitfalls.known import other_work
from pitfalls.known.other_work import allowed_other_work
from pitfalls.known.table import CPU, CUDA, Check, Reading, Row

# Timing and memory figures read against planted values: with the machine to themselves.
pytestmark = pytest.mark.serial

PITFALLS = Path(sys.executable).with_name("pitfalls")
SELF_W0 = "loader speedup: naive against itself, W=0"


def test_calibrate_cpu_passes_with_every_row() -> None:
    done = subprocess.run([str(PITFALLS), "calibrate", "--device", "cpu", "--json"], capture_output=True,
                          text=True, timeout=600)  # about 3 min on a quiet 2-core machine, the loader rows most of it
    assert done.returncode in (0, 1), done.stdout + done.stderr
    rows = {row["check"]: row for row in json.loads(done.stdout)}
    checks = all_checks()
    assert set(rows) == {c.name for c in checks}
    for check in checks:
        row = rows[check.name]
        if check.device == CPU:
            # Every row, as read in this one run: a timed row's reason says what other work it ran beside.
            assert row["verdict"] == "pass", row
        elif not torch.cuda.is_available():
            assert row["verdict"] == "not run" and row["reason"] == "not run here: no CUDA device", row
    assert done.returncode == 0


@pytest.mark.cuda_build
@pytest.mark.held_by("tests/test_calibrate.py::test_calibrate_cpu_passes_with_every_row")
def test_the_doctors_rows_pass_through_the_command() -> None:
    # The doctor's rows alone (one planted run read by all of them), for the CUDA-build leg, where the whole table
    # would take minutes more; where the whole table's run above is collected, it holds them and this is left out.
    from pitfalls.doctor.checks import doctor_checks

    names = [check.name for check in doctor_checks() if check.device == CPU]  # the CUDA ones: "not run" here
    done = subprocess.run([str(PITFALLS), "calibrate", "--device", "cpu", "--json",
                           *(arg for name in names for arg in ("--only", name))],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = json.loads(done.stdout)
    assert [row["check"] for row in rows] == names and all(row["verdict"] == "pass" for row in rows), rows


def _leftover(processes: int, seconds: float) -> list[subprocess.Popen[bytes]]:
    """Processes left over from earlier work: each keeps a core busy for ``seconds`` more, then exits."""
    spin = f"import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end: pass"
    return [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(processes)]


def _charged(processes: list[subprocess.Popen[bytes]]) -> float:
    return sum(sum(psutil.Process(p.pid).cpu_times()[:2]) for p in processes)


def _end(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        process.kill()
        process.wait()


def _other_work(row: Row) -> float:
    found = re.search(r"other work (\d+\.\d+) cores", row.reason)
    assert found, row
    return float(found[1])


def test_a_timed_row_waits_for_leftover_work_to_be_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    """The disturbance found: processes taking CPU while the row is timed (a test run's last processes, another job),
    not what ran before it. Planted: two busy processes per core, more than the cores the row leaves free.

    Timed at once, as the row was, it runs beside them and its reading says so: they took the core it needs. Its
    figure, a median of block pairs, stays unbiased beside them and misses at random (3 of 12 readings beside two
    busy loops here), so a single reading cannot be made to fail; what it shows every time is the other work it ran
    beside. Made to wait, the row starts only once the leftover has exited, and passes.
    """
    (check,) = [c for c in all_checks() if c.name == SELF_W0]
    monkeypatch.setattr(other_work, "WAIT_S", 0.0)
    processes = 2 * (os.cpu_count() or 1)
    leftover = _leftover(processes, 30)
    try:
        time.sleep(0.3)  # their interpreters have started
        charged, began = _charged(leftover), time.perf_counter()
        [beside] = run_checks([check], CPU)
        charged = (_charged(leftover) - charged) / (time.perf_counter() - began)
    finally:
        _end(leftover)
    assert _other_work(beside) >= charged - 0.1, (beside, charged)
    assert f", over the {allowed_other_work(1):.2f} that leave it 1 free" in beside.reason, beside

    monkeypatch.setattr(other_work, "WAIT_S", 30.0)
    life = 3.0
    leftover = _leftover(processes, life)
    gone_by = time.monotonic() + life  # each computes its end after its interpreter starts: later than this
    try:
        began = time.monotonic()
        [waited] = run_checks([check], CPU)
    finally:
        _end(leftover)
    found = re.search(r"waited (\d+\.\d) s for free cores", waited.reason)
    assert found, waited
    # Its reading began after the wait, so after the leftover had exited (0.05 s: the wait's one-decimal print).
    assert began + float(found[1]) >= gone_by - 0.05, (waited, gone_by - began)
    assert waited.verdict == "pass", waited


def test_unknown_only_name_is_one_line_and_exit_2() -> None:
    done = subprocess.run([str(PITFALLS), "calibrate", "--only", "nope"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    assert "'nope' is not a check; allowed:" in last and "time: busy-wait 5 ms" in last
    assert "Traceback" not in done.stderr


def test_cuda_rows_never_pass_without_cuda() -> None:
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the rows run")
    rows = run_checks([c for c in all_checks() if c.device == CUDA], "cuda")
    assert rows and all(r.verdict == "not run" for r in rows)


def test_a_cpu_check_runs_on_the_cpu_when_the_table_is_asked_for_cuda() -> None:
    # The GPU proof asks for the whole table on "cuda": the loader's and the parallel family's rows must still run
    # their planted CPU workload (they had read n/a, or built the step on a device they were not tuned for).
    seen: list[str] = []

    def measure(device: str) -> Reading:
        seen.append(device)
        return Reading(planted=1.0, measured=1.0)

    check = Check(name="planted", instruments=("time",), unit="ms", tolerance=0.1, measure=measure)
    [row] = run_checks([check], CUDA)
    assert seen == [CPU] and row.verdict == "pass"


class _Slow(Dataset[torch.Tensor]):
    """Items a worker takes 100 ms to make (a sleep: the two cores do not decide it)."""

    def __len__(self) -> int:
        return 1000

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(0.1)
        return torch.zeros(1)


def test_speedup_timed_while_other_workers_prefetch_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    # The fault: the other case's workers are live and the baseline's timed calls wait on their queue.
    # The suite's speedup (pitfalls.measure.speedup) runs through pitfalls.probes.timing.case_speedup.
    from pitfalls.probes import timing

    real = timing.interleaved_speedup
    iterator = iter(DataLoader(_Slow(), batch_size=1, num_workers=2, prefetch_factor=1))

    def faulty(baseline, candidate, **kw):  # type: ignore[no-untyped-def]
        return real(lambda: (next(iterator), baseline()), candidate, **kw)

    monkeypatch.setattr(timing, "interleaved_speedup", faulty)
    (check,) = [c for c in shared.shared_checks() if c.name == "speedup: itself, idle workers alive"]
    try:
        row = run_checks([check], CPU)[0]
    finally:
        iterator._shutdown_workers()  # type: ignore[attr-defined]
    assert row.verdict == "fail", row

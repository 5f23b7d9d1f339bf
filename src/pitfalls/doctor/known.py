"""Known answers for `pitfalls doctor`: the planted training script (`planted/train.py`) run under the doctor.

The script plants, per step, one ``.item()``, one ``nonzero``, one sync inside a helper called from one line, a
``.tolist()`` every fifth step and no sync in AdamW's step; a dataset that sleeps ``ITEM_MS`` per item, loaded
``BATCH`` items at a time with no workers; a compiled function with one graph break called with a second shape;
and an endless loop. One run of the doctor (`OneRun`) is read by every row. The rows read a command's report, not
an asv benchmark: they are not published (``published=False``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from pitfalls.doctor.known_rules import only_line, rule_checks
from pitfalls.doctor.known_try import try_checks
from pitfalls.doctor.options import DoctorOptions
from pitfalls.doctor.report import DoctorReport, Finding
from pitfalls.doctor.run import run_doctor
from pitfalls.known.one_run import OneRun
from pitfalls.known.table import CPU, Check, Reading

__all__ = ["BATCH", "ITEM_MS", "PLANTED_SCRIPT", "doctor_checks", "planted_args", "planted_line", "run_planted"]

PLANTED_SCRIPT = Path(__file__).resolve().parent / "planted" / "train.py"
BATCH = 8
ITEM_MS = 10.0
# The doctor's figures these rows calibrate (figures of a command, named here, not asv methods).
SYNC_LINES = "doctor: sync hazards per step by line"
CALL_SITES = "doctor: call sites"
LOADER_WAIT = "doctor: loader wait per step"
GRAPH_BREAKS = "doctor: graph breaks"
RECOMPILES = "doctor: recompiles"
STEPS = "doctor: steps"
# Graph breaks and recompiles are dynamo's, decided before any backend runs: the eager backend reads them without
# inductor's code generation (10-20 s cold on these machines).
BACKEND = "eager"


def planted_args(device: str = CPU, backend: str = BACKEND) -> list[str]:
    """The planted script's arguments: the endless dataset of 10**6 items, the planted batch and sleep."""
    return ["--items", str(10**6), "--batch", str(BATCH), "--item-ms", str(ITEM_MS), "--backend", backend,
            "--device", device]


def planted_line(text: str) -> int:
    """The line of the planted script that holds ``text`` (exactly one does)."""
    return only_line(text, PLANTED_SCRIPT)


def run_planted(device: str = CPU, options: DoctorOptions | None = None) -> DoctorReport:
    """Run the planted script under the doctor on ``device``."""
    return run_doctor(PLANTED_SCRIPT, planted_args(device), options)


@dataclass(frozen=True)
class _Line:
    """A planted sync: the text of its line, the syncs it makes per step, and the line that calls it."""

    text: str
    per_step: float
    caller: str = ""


ITEM = _Line("running += loss.item()", 1.0)
NONZERO = _Line("hits += len(torch.nonzero(", 1.0)
HELPER = _Line("return int((scores > 0).sum())", 1.0, caller="positives += count_positive(")
TOLIST = _Line("logged.append(logits.detach()[0].tolist())", 0.2)
OPTIMIZER = _Line("optimizer.step()", 0.0)


def syncs_at(report: DoctorReport, planted: _Line) -> float:
    """The sync findings' count per step at a planted line; at a helper, only those reached from its caller."""
    line = planted_line(planted.text)
    found: Sequence[Finding] = report.finding_at("sync", str(PLANTED_SCRIPT), line)
    if planted.caller:
        caller = (str(PLANTED_SCRIPT), planted_line(planted.caller))
        found = [f for f in found if f.call_sites[:1] == (caller,)]
    return sum(f.per_step or 0.0 for f in found)


_RUN: OneRun[DoctorReport] = OneRun(run_planted)


def _sync_check(name: str, planted: _Line, instruments: tuple[str, ...] = (SYNC_LINES,)) -> Check:
    def measure(device: str) -> Reading:
        report = _RUN.take(name, device)
        return Reading(planted.per_step, syncs_at(report, planted), f"{report.steps.scanned} steps scanned")

    return Check(name, instruments, "syncs/step", 0.0, measure, absolute=True, published=False,
                 why="counts are exact: every scanned step runs each planted line the same way")


def _loader_wait(device: str) -> Reading:
    report = _RUN.take("doctor: loader wait of a planted sleep", device)
    measured = report.loader.ms_per_step if report.loader is not None else 0.0
    return Reading(BATCH * ITEM_MS, measured, f"{report.steps.measured} timed steps, "
                                              f"{report.loader.verdict if report.loader else 'no loader seen'}")


def _graph_breaks(device: str) -> Reading:
    report = _RUN.take("doctor: one planted graph break", device)
    return Reading(1.0, float(len(report.compile.graph_breaks)),
                   "; ".join(f"{b['reason']} at line {b['line']}" for b in report.compile.graph_breaks))


def _recompiled(device: str) -> Reading:
    report = _RUN.take("doctor: a second shape recompiles", device)
    functions = sorted({r["function"] for r in report.compile.recompiles})
    return Reading(1.0, float(len(functions)), f"functions compiled again: {', '.join(functions) or 'none'}")


def _steps(device: str) -> Reading:
    report = _RUN.take("doctor: an endless loop stops after its steps", device)
    options = DoctorOptions()
    return Reading(float(options.cpu_steps), float(report.steps.total), report.ended)


def doctor_checks() -> tuple[Check, ...]:
    """The doctor's rows of the calibration table (the planted training script's, then the rules'; not
    published)."""
    row = partial(Check, published=False)
    return (
        _sync_check("doctor: .item() on one line, 1 a step", ITEM),
        _sync_check("doctor: nonzero on another, 1 a step", NONZERO),
        _sync_check("doctor: a helper's sync at its call site, 1 a step", HELPER, (SYNC_LINES, CALL_SITES)),
        _sync_check("doctor: .tolist() every fifth step, 0.2 a step", TOLIST),
        _sync_check("doctor: AdamW's step, no sync", OPTIMIZER),
        row("doctor: loader wait of a planted sleep", (LOADER_WAIT,), "ms", 0.10, _loader_wait,
            why=f"{BATCH} items of {ITEM_MS:g} ms each, no workers: the wait is the sleeps plus the loader's own "
            "work (about 2 % here)"),
        row("doctor: one planted graph break", (GRAPH_BREAKS,), "breaks", 0.0, _graph_breaks, absolute=True,
            why="one torch._dynamo.graph_break() in the compiled function"),
        row("doctor: a second shape recompiles", (RECOMPILES,), "functions", 0.0, _recompiled, absolute=True,
            why="the compiled function is called with half the batch too: it, and its frame resumed after the "
            "break, compile again"),
        row("doctor: an endless loop stops after its steps", (STEPS,), "steps", 0.0, _steps, absolute=True,
            why="while True over 10**6 items: warm-up, timed, one before the scan and scanned steps, then stopped"),
        *rule_checks(),
        *try_checks(),
    )

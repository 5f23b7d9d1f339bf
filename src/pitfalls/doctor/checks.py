"""Known answers for `pitfalls doctor`: its planted scripts run under the doctor, one run a script and device shared
by its rows, which read a command's report and so are not published (docs/doctor.md, "Calibrated").
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pitfalls import processes
from pitfalls.doctor import planted, rules
from pitfalls.doctor.options import DoctorOptions
from pitfalls.doctor.planted import ddp
from pitfalls.doctor.report import DoctorReport, Finding
from pitfalls.doctor.rule import Rule, ScriptLine
from pitfalls.doctor.run import run_doctor
from pitfalls.doctor.try_checks import try_checks
from pitfalls.known.one_run import OneRun
from pitfalls.known.table import CPU, CUDA, Check, Reading

__all__ = ["HELPER", "ITEM", "NONZERO", "OPTIMIZER", "RULES_OPTIONS", "TOLIST", "doctor_checks", "found_at",
           "planted_args", "planted_line", "rule_checks", "run_planted", "run_ranks", "run_script", "syncs_at"]

# The doctor's figures these rows calibrate (figures of a command, named here, not asv methods).
SYNC_LINES = "doctor: sync hazards per step by line"
CALL_SITES = "doctor: call sites"
LOADER_WAIT = "doctor: loader wait per step"
GRAPH_BREAKS = "doctor: graph breaks"
RECOMPILES = "doctor: recompiles"
STEPS = "doctor: steps"
DDP_COMMUNICATION = "doctor: DDP's all-reduces and bytes a step"
BY_RANK = "doctor: findings by rank"
RULE_FINDINGS = "doctor: rule findings at their lines"
# The rules script needs no timing: a few steps, the scanned ones as many as the doctor's default; its compiled
# function meets its new shape in step 3, the first timed one.
RULES_OPTIONS = DoctorOptions(warmup=2, steps=2, scanned=5, memory=1)


def run_script(script: str, args: tuple[str, ...], device: str) -> DoctorReport:
    """Run a planted script under the doctor on ``device``, with the options its rows need: few steps for the rules
    scripts, and the GPU path's, written for CUDA, on its CUDA path (on the CPU under ``--cuda-on-cpu``)."""
    if Path(script) == planted.GPU_PATH:
        options = dataclasses.replace(RULES_OPTIONS, cuda_on_cpu=device == CPU)
        return run_doctor(script, [*args, "--device", "cuda"], options)
    options = RULES_OPTIONS if Path(script) == planted.RULES else DoctorOptions()
    return run_doctor(script, [*args, "--device", device], options)


_RUNS: OneRun[DoctorReport] = OneRun(run_script)


def found_at(report: DoctorReport, rule: Rule, line: ScriptLine) -> list[Finding]:
    """The findings of one rule at one planted line."""
    return [f for f in report.findings if f.rule == rule.name and f.path == str(line.script) and f.line == line.number]


def _rule_row(rule: Rule, device: str, twin: bool) -> Check:
    line = rule.plant.right if twin else rule.plant.planted
    name = f"doctor rule on {device}: {rule.name}, " + ("none at its twin" if twin else "one at its planted line")

    def measure(on: str) -> Reading:
        report = _RUNS.take(name, str(line.script), line.args, on)
        found = found_at(report, rule, line)
        return Reading(0.0 if twin else 1.0, float(len(found)),
                       "; ".join(f.title for f in found) or f"none at {line.script.name}:{line.number}")

    return Check(name, (RULE_FINDINGS,), "findings", 0.0, measure, device=device, absolute=True, published=False,
                 why="the twin done right: no finding of the rule" if twin else "one planted: one finding there")


def rule_checks() -> tuple[Check, ...]:
    """Two rows a registered rule (its planted line, its twin) on the CPU; the same on CUDA where the answer depends
    on the device."""
    registered = rules.all_rules()
    return (*(_rule_row(r, CPU, twin) for r in registered for twin in (False, True)),
            *(_rule_row(r, CUDA, twin) for r in registered if r.plant.cuda for twin in (False, True)))


def run_ranks() -> dict[str, Any]:
    """The planted DDP script under the doctor in 2 ranks (gloo): the report of every rank (``--json``)."""
    command = [sys.executable, "-m", "pitfalls", "doctor", "--nproc-per-node", "2", "--json", "--warmup", "2",
               "--steps", "4", "--scanned", "2", "--budget", "120", str(planted.DDP)]
    done = processes.run(command, timeout_s=300, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if not done.stdout.strip().startswith("{"):
        raise RuntimeError(f"the doctor under torchrun printed no report (exit {done.returncode}): "
                           f"{(done.stderr.strip().splitlines() or [''])[-1]}")
    return dict(json.loads(done.stdout))


_RANKS: OneRun[dict[str, Any]] = OneRun(run_ranks)


def _rank_rows() -> tuple[Check, ...]:
    """DDP's communication on each rank, and the planted .item() on rank 0 only (2 ranks, one shared launch)."""
    line = ScriptLine(planted.DDP, "# planted: a sync on rank 0 only").number
    bucket, micro_batches = ddp.BUCKET_BYTES, ddp.MICRO_BATCHES

    def communication(name: str, field: str, planted_value: float) -> Check:
        def measure(_device: str) -> Reading:
            world = _RANKS.take(name)
            figures = [report.get("ddp") or {} for report in world["ranks"]]
            worst = max((abs(f.get(field, 0.0) - planted_value), f.get(field, 0.0)) for f in figures)[1]
            return Reading(planted_value, float(worst), f"{field} on each rank: {[f.get(field) for f in figures]}")

        return Check(name, (DDP_COMMUNICATION,), "a step", 0.0, measure, absolute=True, published=False,
                     why=f"{micro_batches} micro-batches a step without no_sync: each backward all-reduces the one "
                         "bucket; the farthest rank is read")

    def item_on(rank: int) -> Check:
        name = f"doctor under torchrun: the .item() of rank 0 only, on rank {rank}"

        def measure(_device: str) -> Reading:
            report = _RANKS.take(name)["ranks"][rank]
            found = [f["per_step"] for f in report.get("findings", []) if f["kind"] == "sync" and f["line"] == line]
            return Reading(1.0 if rank == 0 else 0.0, float(sum(found)), f"{report['steps']['scanned']} steps scanned")

        return Check(name, (BY_RANK,), "syncs/step", 0.0, measure, absolute=True, published=False,
                     why="logged on rank 0 only: counts are exact on each rank")

    return (communication(f"doctor under torchrun: {micro_batches} all-reduces a step", "reductions_per_step",
                          float(micro_batches)),
            communication(f"doctor under torchrun: {micro_batches} x {bucket} bytes all-reduced a step",
                          "bytes_per_step", float(micro_batches * bucket)),
            item_on(0), item_on(1))


def planted_args(device: str = CPU) -> list[str]:
    """The training script's arguments: the endless dataset of 10**6 items, the planted batch and sleep."""
    return [*planted.TRAIN_ARGS, "--device", device]


def planted_line(text: str) -> int:
    """The line of the training script that holds ``text`` (exactly one does)."""
    return ScriptLine(planted.TRAIN, text).number


def run_planted(device: str = CPU) -> DoctorReport:
    """Run the training script under the doctor on ``device``."""
    return run_script(str(planted.TRAIN), planted.TRAIN_ARGS, device)


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


def syncs_at(report: DoctorReport, line: _Line) -> float:
    """The sync findings' count per step at a planted line; at a helper, only those reached from its caller."""
    found: Sequence[Finding] = report.finding_at("sync", str(planted.TRAIN), planted_line(line.text))
    if line.caller:
        caller = (str(planted.TRAIN), planted_line(line.caller))
        found = [f for f in found if f.call_sites[:1] == (caller,)]
    return sum(f.per_step or 0.0 for f in found)


def _row(name: str, instruments: tuple[str, ...], unit: str, tolerance: float,
         read: Callable[[DoctorReport], Reading], why: str, absolute: bool = True) -> Check:
    """A row that reads the shared run of the training script (not published)."""
    return Check(name, instruments, unit, tolerance,
                 lambda device: read(_RUNS.take(name, str(planted.TRAIN), planted.TRAIN_ARGS, device)),
                 absolute=absolute, published=False, why=why)


def _sync_check(name: str, line: _Line, instruments: tuple[str, ...] = (SYNC_LINES,)) -> Check:
    def read(report: DoctorReport) -> Reading:
        return Reading(line.per_step, syncs_at(report, line), f"{report.steps.scanned} steps scanned")

    return _row(name, instruments, "syncs/step", 0.0, read,
                "counts are exact: every scanned step runs each planted line the same way")


def _loader_wait(report: DoctorReport) -> Reading:
    measured = report.loader.ms_per_step if report.loader is not None else 0.0
    return Reading(planted.BATCH * planted.ITEM_MS, measured, f"{report.steps.measured} timed steps, "
                   f"{report.loader.verdict if report.loader else 'no loader seen'}")


def _graph_breaks(report: DoctorReport) -> Reading:
    return Reading(1.0, float(len(report.compile.graph_breaks)),
                   "; ".join(f"{b.reason} at line {b.line}" for b in report.compile.graph_breaks))


def _recompiled(report: DoctorReport) -> Reading:
    functions = sorted({r.function for r in report.compile.recompiles})
    return Reading(1.0, float(len(functions)), f"functions compiled again: {', '.join(functions) or 'none'}")


def _steps(report: DoctorReport) -> Reading:
    return Reading(float(DoctorOptions().cpu_steps), float(report.steps.total), report.ended)


def doctor_checks() -> tuple[Check, ...]:
    """The doctor's rows of the calibration table (the training script's, the rules', `--try`'s; not
    published)."""
    return (
        _sync_check("doctor: .item() on one line, 1 a step", ITEM),
        _sync_check("doctor: nonzero on another, 1 a step", NONZERO),
        _sync_check("doctor: a helper's sync at its call site, 1 a step", HELPER, (SYNC_LINES, CALL_SITES)),
        _sync_check("doctor: .tolist() every fifth step, 0.2 a step", TOLIST),
        _sync_check("doctor: AdamW's step, no sync", OPTIMIZER),
        _row("doctor: loader wait of a planted sleep", (LOADER_WAIT,), "ms", 0.10, _loader_wait, absolute=False,
             why=f"{planted.BATCH} items of {planted.ITEM_MS:g} ms each, no workers: the wait is the sleeps plus the "
             "loader's own work (about 2 % here)"),
        _row("doctor: one planted graph break", (GRAPH_BREAKS,), "breaks", 0.0, _graph_breaks,
             why="one torch._dynamo.graph_break() in the compiled function"),
        _row("doctor: a second shape recompiles", (RECOMPILES,), "functions", 0.0, _recompiled,
             why="the compiled function is called with half the batch too: it, and its frame resumed after the "
             "break, compile again"),
        _row("doctor: an endless loop stops after its steps", (STEPS,), "steps", 0.0, _steps,
             why="while True over 10**6 items: warm-up, timed, one before the scan, scanned and memory steps, then "
             "stopped"),
        *rule_checks(),
        *_rank_rows(),
        *try_checks(),
    )

"""Known answers for `pitfalls doctor`: its planted scripts run under the doctor (docs/doctor.md, "Calibrated").

The training script (`planted/train.py`) plants, per step, one ``.item()``, one ``nonzero``, one sync inside a
helper called from one line, a ``.tolist()`` every fifth step and no sync in AdamW's step; a dataset that sleeps
``ITEM_MS`` per item, loaded ``BATCH`` items at a time with no workers; a compiled function with one graph break
called with a second shape; and an endless loop. One run of the doctor (`OneRun`) is read by every row.

The rules script (`planted/rules.py`) plants each rule once, on a line marked ``# planted: ...``, beside its
right-thing counterpart on a line marked ``# right: ...``. A row per rule reads its findings at its planted line
(1); one row reads every finding on the right-thing lines (0). The CPU rows share one run; the CUDA rows share one
run on a GPU, where the matmul rules read what CUDA's autocast casts and TF32 applies (compute capability 8.0 or
later). The rows read a command's report, not an asv benchmark: they are not published (``published=False``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pitfalls.doctor import rules
from pitfalls.doctor.known_try import try_checks
from pitfalls.doctor.options import DoctorOptions
from pitfalls.doctor.report import DoctorReport, Finding
from pitfalls.doctor.run import run_doctor
from pitfalls.known.one_run import OneRun
from pitfalls.known.table import CPU, CUDA, Check, Reading

__all__ = ["BATCH", "ITEM_MS", "PLANTED", "PLANTED_SCRIPT", "RULES_SCRIPT", "Planted", "at_planted", "doctor_checks",
           "lines_marked", "on_right_lines", "only_line", "planted_args", "planted_line", "rule_checks", "run_planted",
           "run_rules"]

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


RULES_SCRIPT = Path(__file__).resolve().parent / "planted" / "rules.py"
# Rules need no timing: a few steps, the scanned ones as many as the doctor's default.
RULES_OPTIONS = DoctorOptions(warmup=2, steps=2, scanned=5, memory=1)
RULE_FINDINGS = "doctor: rule findings at their lines"
RIGHT = "# right:"
_SYNC_FIXES = ("make it on the device", "copy from pinned memory without waiting")


@dataclass(frozen=True)
class Planted:
    """One planted rule: the text of its line, and what a finding there must be.

    Attributes:
        name: the row's rule, as its name reads.
        text: text on exactly one line of the script.
        kind: the finding's kind ("rule" for the rules; "sync" for a blocking copy, "copy" for a non-blocking one).
        rule: the rule's name, for kind "rule".
        fix: text the fix must hold, for the kinds "sync" and "copy".
        cuda: the rule whose answer a GPU run checks too (the device's dtypes and TF32).
    """

    name: str
    text: str
    kind: str = "rule"
    rule: str = ""
    fix: str = ""
    cuda: bool = False


PLANTED = (
    Planted(rules.FOREACH.name, "slow = torch.optim.AdamW(", rule=rules.FOREACH.name),
    Planted(rules.ZERO_GRAD.name, "slow.zero_grad(set_to_none=False)", rule=rules.ZERO_GRAD.name),
    Planted(rules.CONV_BIAS.name, "self.biased = nn.Conv2d(", rule=rules.CONV_BIAS.name),
    Planted(rules.TF32_MATMUL.name, "logits = self.head(x)", rule=rules.TF32_MATMUL.name, cuda=True),
    Planted(rules.TF32_CONV.name, "smoothed = blur(images)", rule=rules.TF32_CONV.name),
    Planted(rules.UNALIGNED.name, "odd = self.odd(x)", rule=rules.UNALIGNED.name, cuda=True),
    Planted(rules.FACTORY_COPY.name, "noise = torch.randn(BATCH, CLASSES).to(device)", kind="sync",
            fix=_SYNC_FIXES[0]),
    Planted("a batch's blocking copy", "labels = labels.to(device)  # planted", kind="sync", fix=_SYNC_FIXES[1]),
    Planted(rules.PAGEABLE_COPY.name, "images = images.to(device, non_blocking=True)", kind="copy",
            fix="pin the host memory"),
)


def lines_marked(text: str, script: Path = RULES_SCRIPT) -> list[int]:
    """The lines of ``script`` that hold ``text``."""
    return [n for n, line in enumerate(script.read_text().splitlines(), start=1) if text in line]


def only_line(text: str, script: Path = RULES_SCRIPT) -> int:
    """The line of ``script`` that holds ``text`` (exactly one does)."""
    found = lines_marked(text, script)
    if len(found) != 1:
        raise ValueError(f"{text!r} is on {len(found)} lines of {script}, not one")
    return found[0]


def _matches(finding: Finding, planted: Planted) -> bool:
    if finding.kind != planted.kind:
        return False
    return finding.rule == planted.rule if planted.kind == "rule" else planted.fix in finding.fix


def at_planted(report: DoctorReport, planted: Planted) -> list[Finding]:
    """The findings of a planted rule at its line."""
    line = only_line(planted.text)
    return [f for f in report.findings if f.path == str(RULES_SCRIPT) and f.line == line and _matches(f, planted)]


def on_right_lines(report: DoctorReport) -> list[Finding]:
    """Every finding a rule makes on a right-thing line (none is allowed). A non-blocking copy from pinned memory
    is the right thing's own cost, its bytes, and no rule's."""
    right = set(lines_marked(RIGHT))
    return [f for f in report.findings if f.path == str(RULES_SCRIPT) and f.line in right
            and not (f.kind == "copy" and ", pinned," in f.title)]


def run_rules(device: str = CPU) -> DoctorReport:
    """Run the planted rules script under the doctor on ``device``."""
    return run_doctor(RULES_SCRIPT, ["--device", device], RULES_OPTIONS)


_RULES_RUN: OneRun[DoctorReport] = OneRun(run_rules)


def _planted_row(planted: Planted, device: str) -> Check:
    name = f"doctor rule on {device}: {planted.name}, at its line"

    def measure(on: str) -> Reading:
        report = _RULES_RUN.take(name, on)
        found = at_planted(report, planted)
        return Reading(1.0, float(len(found)), "; ".join(f.title for f in found) or f"none at line "
                                                                                     f"{only_line(planted.text)}")

    return Check(name, (RULE_FINDINGS,), "findings", 0.0, measure, device=device, absolute=True, published=False,
                 why="one planted on its line: exactly one finding there")


def _right_row(device: str) -> Check:
    name = f"doctor rules on {device}: the right-thing lines, no finding"

    def measure(on: str) -> Reading:
        report = _RULES_RUN.take(name, on)
        found = on_right_lines(report)
        return Reading(0.0, float(len(found)), "; ".join(f"line {f.line}: {f.title}" for f in found)
                       or f"{len(lines_marked(RIGHT))} right-thing lines")

    return Check(name, (RULE_FINDINGS,), "findings", 0.0, measure, device=device, absolute=True, published=False,
                 why="each rule's counterpart done right: no finding at all")


def rule_checks() -> tuple[Check, ...]:
    """The rules' rows: each planted rule and the right-thing lines, on the CPU; the GPU's rules on CUDA."""
    return (*(_planted_row(p, CPU) for p in PLANTED), _right_row(CPU),
            *(_planted_row(p, CUDA) for p in PLANTED if p.cuda), _right_row(CUDA))


def planted_args(device: str = CPU) -> list[str]:
    """The planted script's arguments: the endless dataset of 10**6 items, the planted batch and sleep."""
    return ["--items", str(10**6), "--batch", str(BATCH), "--item-ms", str(ITEM_MS), "--backend", BACKEND,
            "--device", device]


def planted_line(text: str) -> int:
    """The line of the planted script that holds ``text`` (exactly one does)."""
    return only_line(text, PLANTED_SCRIPT)


def run_planted(device: str = CPU) -> DoctorReport:
    """Run the planted script under the doctor on ``device``."""
    return run_doctor(PLANTED_SCRIPT, planted_args(device))


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


def _row(name: str, instruments: tuple[str, ...], unit: str, tolerance: float,
         read: Callable[[DoctorReport], Reading], why: str, absolute: bool = True) -> Check:
    """A row that reads the shared run of the planted script (not published)."""
    return Check(name, instruments, unit, tolerance, lambda device: read(_RUN.take(name, device)), absolute=absolute,
                 published=False, why=why)


def _sync_check(name: str, planted: _Line, instruments: tuple[str, ...] = (SYNC_LINES,)) -> Check:
    def read(report: DoctorReport) -> Reading:
        return Reading(planted.per_step, syncs_at(report, planted), f"{report.steps.scanned} steps scanned")

    return _row(name, instruments, "syncs/step", 0.0, read,
                "counts are exact: every scanned step runs each planted line the same way")


def _loader_wait(report: DoctorReport) -> Reading:
    measured = report.loader.ms_per_step if report.loader is not None else 0.0
    return Reading(BATCH * ITEM_MS, measured, f"{report.steps.measured} timed steps, "
                                              f"{report.loader.verdict if report.loader else 'no loader seen'}")


def _graph_breaks(report: DoctorReport) -> Reading:
    return Reading(1.0, float(len(report.compile.graph_breaks)),
                   "; ".join(f"{b['reason']} at line {b['line']}" for b in report.compile.graph_breaks))


def _recompiled(report: DoctorReport) -> Reading:
    functions = sorted({r["function"] for r in report.compile.recompiles})
    return Reading(1.0, float(len(functions)), f"functions compiled again: {', '.join(functions) or 'none'}")


def _steps(report: DoctorReport) -> Reading:
    return Reading(float(DoctorOptions().cpu_steps), float(report.steps.total), report.ended)


def doctor_checks() -> tuple[Check, ...]:
    """The doctor's rows of the calibration table (the planted training script's, then the rules'; not
    published)."""
    return (
        _sync_check("doctor: .item() on one line, 1 a step", ITEM),
        _sync_check("doctor: nonzero on another, 1 a step", NONZERO),
        _sync_check("doctor: a helper's sync at its call site, 1 a step", HELPER, (SYNC_LINES, CALL_SITES)),
        _sync_check("doctor: .tolist() every fifth step, 0.2 a step", TOLIST),
        _sync_check("doctor: AdamW's step, no sync", OPTIMIZER),
        _row("doctor: loader wait of a planted sleep", (LOADER_WAIT,), "ms", 0.10, _loader_wait, absolute=False,
             why=f"{BATCH} items of {ITEM_MS:g} ms each, no workers: the wait is the sleeps plus the loader's own "
             "work (about 2 % here)"),
        _row("doctor: one planted graph break", (GRAPH_BREAKS,), "breaks", 0.0, _graph_breaks,
             why="one torch._dynamo.graph_break() in the compiled function"),
        _row("doctor: a second shape recompiles", (RECOMPILES,), "functions", 0.0, _recompiled,
             why="the compiled function is called with half the batch too: it, and its frame resumed after the "
             "break, compile again"),
        _row("doctor: an endless loop stops after its steps", (STEPS,), "steps", 0.0, _steps,
             why="while True over 10**6 items: warm-up, timed, one before the scan and scanned steps, then stopped"),
        *rule_checks(),
        *try_checks(),
    )

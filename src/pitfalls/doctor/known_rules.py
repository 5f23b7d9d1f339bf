"""Known answers for the doctor's rules: the planted rules script (`planted/rules.py`) run under the doctor.

Each rule is planted once, on a line marked ``# planted: ...``, beside its right-thing counterpart on a line marked
``# right: ...``. A row per rule reads its findings at its planted line (1); one row reads every finding on the
right-thing lines (0). The CPU rows share one run; the CUDA rows share one run on a GPU, where the matmul rules
read what CUDA's autocast casts and TF32 applies (compute capability 8.0 or later). Not published: they read a
command's report.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pitfalls.doctor import rules
from pitfalls.doctor.options import DoctorOptions
from pitfalls.doctor.report import DoctorReport, Finding
from pitfalls.doctor.run import run_doctor
from pitfalls.known.one_run import OneRun
from pitfalls.known.table import CPU, CUDA, Check, Reading

__all__ = ["PLANTED", "RULES_SCRIPT", "Planted", "at_planted", "lines_marked", "on_right_lines", "only_line",
           "rule_checks", "run_rules"]

RULES_SCRIPT = Path(__file__).resolve().parent / "planted" / "rules.py"
# Rules need no timing: a few steps, the scanned ones as many as the doctor's default.
OPTIONS = DoctorOptions(warmup=2, steps=2, scanned=5, memory=1)
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
    return run_doctor(RULES_SCRIPT, ["--device", device], OPTIONS)


_RUN: OneRun[DoctorReport] = OneRun(run_rules)


def _planted_row(planted: Planted, device: str) -> Check:
    name = f"doctor rule on {device}: {planted.name}, at its line"

    def measure(on: str) -> Reading:
        report = _RUN.take(name, on)
        found = at_planted(report, planted)
        return Reading(1.0, float(len(found)), "; ".join(f.title for f in found) or f"none at line "
                                                                                     f"{only_line(planted.text)}")

    return Check(name, (RULE_FINDINGS,), "findings", 0.0, measure, device=device, absolute=True, published=False,
                 why="one planted on its line: exactly one finding there")


def _right_row(device: str) -> Check:
    name = f"doctor rules on {device}: the right-thing lines, no finding"

    def measure(on: str) -> Reading:
        report = _RUN.take(name, on)
        found = on_right_lines(report)
        return Reading(0.0, float(len(found)), "; ".join(f"line {f.line}: {f.title}" for f in found)
                       or f"{len(lines_marked(RIGHT))} right-thing lines")

    return Check(name, (RULE_FINDINGS,), "findings", 0.0, measure, device=device, absolute=True, published=False,
                 why="each rule's counterpart done right: no finding at all")


def rule_checks() -> tuple[Check, ...]:
    """The rules' rows: each planted rule and the right-thing lines, on the CPU; the GPU's rules on CUDA."""
    return (*(_planted_row(p, CPU) for p in PLANTED), _right_row(CPU),
            *(_planted_row(p, CUDA) for p in PLANTED if p.cuda), _right_row(CUDA))


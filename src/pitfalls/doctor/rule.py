"""A rule of the doctor's, one unit: what it finds, the fix, the peer's rule it follows, where it applies, the
instrument it reads, how it turns what was seen into findings, and its planted line with its right-thing twin
(docs/doctor.md, "The rules"; docs/extending.md, "Your own rule").
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

from pitfalls.doctor.reasons import NO_FIX_COST
from pitfalls.doctor.records import ScanContext, Seen
from pitfalls.doctor.report import Finding, FindingKind, line_fields
from pitfalls.probes.sites import SourceLine

__all__ = ["Hit", "Plant", "Rule", "ScriptLine"]


@dataclass(frozen=True)
class ScriptLine:
    """A line of a planted script, named by text that is on it and on no other line.

    Attributes:
        script: a training script that imports nothing of pitfalls and takes ``--device`` (``python SCRIPT ARGS
            --device cpu`` runs it).
        text: the text on the line.
        args: the script's arguments, but the device.
    """

    script: Path
    text: str
    args: tuple[str, ...] = ()

    @property
    def number(self) -> int:
        """The line's number (exactly one line of the script holds the text)."""
        found = [n for n, line in enumerate(self.script.read_text().splitlines(), start=1) if self.text in line]
        if len(found) != 1:
            raise ValueError(f"{self.text!r} is on {len(found)} lines of {self.script}, not one")
        return found[0]


@dataclass(frozen=True)
class Plant:
    """A rule's known answer: the line where it is planted, where the rule must find exactly one thing, and its
    right-thing twin, where it must find nothing; ``cuda``: the answer depends on the device (autocast for CUDA,
    TF32), so a GPU run checks it too."""

    planted: ScriptLine
    right: ScriptLine
    cuda: bool = False

    @classmethod
    def of(cls, script: Path, planted: str, right: str, cuda: bool = False) -> Plant:
        """Both lines in one script, run with no argument but the device."""
        return cls(ScriptLine(script, planted), ScriptLine(script, right), cuda)


@dataclass(frozen=True)
class Hit:
    """One thing a rule found; the rule gives it its kind, its fix and its name.

    Attributes:
        line: the script's line (None when none can be named).
        per_step: how often per step, or None when it is not counted per step.
        ms_per_step: its cost per step, or None when it could not be measured.
        cost: how the cost was measured, or why not ("": the run's reason, no GPU or what the fix saves).
        call_sites: for a line inside a helper, the lines of the step that reached it.
    """

    title: str
    line: SourceLine | None
    per_step: float | None
    ms_per_step: float | None = None
    cost: str = ""
    call_sites: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class Rule:
    """One rule (see the module docstring).

    Attributes:
        name: its short name, each finding's ``rule``.
        fix: the change that removes it: every finding's fix, word for word.
        source: the peer's rule it follows (PyTorch's profiler pattern matcher, Nsight Systems), or the suite's own.
        reads: the instrument it reads, in words.
        find: turns what a run saw into its hits.
        instrument: makes the instrument it needs during the scanned steps (None: it reads the run's records);
            rules that name the same maker share one instrument, read back with ``seen.scanned(maker)``.
        plant: its known answer: `pitfalls calibrate` runs it (`checks.rule_checks`).
        where: where the doctor reads it, and where it costs.
        gated: its counts per step are exact on a CPU: ``--baseline`` fails on a new one or one that grew.
        watch: makes a watch over the whole run, entered before the script starts and left after it ends (where
            the script made something, a setting it left on), for what happens before the scanned steps; rules
            that name the same maker share one, read back with ``seen.watched(maker)``.
    """

    name: str
    kind: FindingKind
    finds: str
    fix: str
    source: str
    reads: str
    find: Callable[[Seen], Iterable[Hit]] = field(repr=False)
    plant: Plant
    instrument: Callable[[ScanContext], AbstractContextManager[Any]] | None = field(default=None, repr=False)
    where: str = "CPU or GPU"
    gated: bool = False
    watch: Callable[[], AbstractContextManager[Any]] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not (self.name.strip() and self.finds.strip() and self.fix.strip() and self.source.strip()):
            raise ValueError(f"rule {self.name!r}: a rule needs a name, what it finds, a fix and a source")
        if self.kind not in get_args(FindingKind):
            raise ValueError(f"rule {self.name!r}: kind={self.kind!r} is not allowed; allowed: "
                             f"{', '.join(get_args(FindingKind))}")

    def findings(self, seen: Seen) -> list[Finding]:
        """Its findings in a run: each hit with the rule's kind, fix and name."""
        return [Finding(**line_fields(hit.line), kind=self.kind, title=hit.title, per_step=hit.per_step,
                        call_sites=hit.call_sites, ms_per_step=hit.ms_per_step,
                        cost=hit.cost or f"not measured: {seen.no_gpu or NO_FIX_COST}", fix=self.fix, rule=self.name)
                for hit in self.find(seen)]

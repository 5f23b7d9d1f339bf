"""The doctor's report: the ranked findings, each phase's figures, what was not measured; and its JSON."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any, Literal

from pitfalls.doctor.copies import Direction
from pitfalls.doctor.ddp_watch import DdpFigures
from pitfalls.doctor.reasons import NO_GPU
from pitfalls.families.loader.verdict import Bound
from pitfalls.probes.compiled import GraphBreakSite
from pitfalls.probes.sites import SourceLine

__all__ = [
    "CompileSummary", "CopyRow", "CountedBy", "CudaOnCpuFigures", "DoctorReport", "Failure", "Finding", "FindingKind",
    "LoaderFigures", "MemoryFigures", "OneOff", "RealSyncRow", "RecompileRow", "StepsDone", "line_fields", "rank",
]

# What a finding is a cost of.
FindingKind = Literal["loader", "sync", "copy", "compile", "memory", "rule"]
# What ended a step: the first optimizer's step, or (a script with no optimizer) the next DataLoader batch asked for.
CountedBy = Literal["optimizer", "loader"]


def line_fields(line: SourceLine | None) -> dict[str, Any]:
    """The fields of a finding or a copy row that name the script's line (None and "" where none can be named)."""
    if line is None:
        return {"path": None, "line": None, "code": "", "function": ""}
    return {"path": line.path, "line": line.lineno, "code": line.code, "function": line.function}


@dataclass(frozen=True, kw_only=True)
class Finding:
    """One cost of the step, with its fix; its fields in the order of its JSON entry.

    Attributes:
        rank: its place in the report (1: the costliest).
        path: the script's file where it is (None when no line can be named), at ``line``, whose text is ``code``.
        per_step: how often per step (the mean over the steps it was counted in; a line run every fifth step
            reads 0.2), or None when it is not counted per step.
        call_sites: for a line inside a helper, the lines of the step that reached it, most used first.
        ms_per_step: its estimated cost per step, or None when it could not be measured (``cost`` says why).
        share_of_step: ``ms_per_step`` over the mean step time (the loader's is its wait share).
        cost: how the cost was measured, or why it was not.
        fix: its rule's fix, word for word.
    """

    rank: int = 0
    kind: FindingKind
    title: str
    path: str | None = None
    line: int | None = None
    code: str = ""
    per_step: float | None = None
    call_sites: tuple[tuple[str, int], ...] = ()
    ms_per_step: float | None = None
    share_of_step: float | None = None
    cost: str
    fix: str
    rule: str
    function: str = ""

    def as_json(self) -> dict[str, Any]:
        """The finding as the JSON report's ``findings`` entry."""
        return {**asdict(self), "call_sites": [{"path": path, "line": line} for path, line in self.call_sites],
                "function": self.function or None}


def _order(finding: Finding) -> tuple[int, float, str, int]:
    if finding.ms_per_step is not None:
        return 0, -finding.ms_per_step, finding.path or "", finding.line or 0
    per_step = finding.per_step if finding.per_step is not None else -1.0
    return 1, -per_step, finding.path or "", finding.line or 0


def rank(findings: Iterable[Finding], step_ms: float | None) -> tuple[Finding, ...]:
    """Order findings by cost and number them, each with its share of the step: those measured first, the costliest
    first; the rest by how often per step.

    Args:
        findings: the findings, in any order (the order of their rules breaks ties).
        step_ms: the mean step time (None when no step was timed: no share is given); the mean, so that the
            loader's share is its wait share, the wait over the time of the timed steps.

    Returns:
        The findings, ranked from 1.
    """
    return tuple(
        dataclasses.replace(
            finding, rank=position,
            share_of_step=finding.ms_per_step / step_ms if finding.ms_per_step is not None and step_ms else None,
        )
        for position, finding in enumerate(sorted(findings, key=_order), start=1)
    )


@dataclass(frozen=True)
class StepsDone:
    """The steps each phase ran (``measured``: the timed ones; ``memory`` 0 on CUDA, ``gpu`` 0 without a GPU), what
    ended a step (None: no step), and every step the script finished."""

    warmup: int
    measured: int
    memory: int
    before_scan: int
    scanned: int
    gpu: int
    counted_by: CountedBy | None
    total: int


@dataclass(frozen=True)
class Failure:
    """The script raised (or exited with an error status) before its steps were done.

    Attributes:
        last_line: the exception's last line, e.g. "ValueError: bad batch".
        step: the step it happened in (1 for the first; 0 before the first step began).
        traceback: from the script's first frame ("" for an exit status).
        hint: what to do about it, on its own line ("": nothing to add).
    """

    last_line: str
    step: int
    traceback: str = ""
    hint: str = ""


@dataclass(frozen=True)
class LoaderFigures:
    """The DataLoader over the timed steps: the share of the step and the ms a step it waits in ``next()``, the loader
    family's verdict, a batch's bytes (None: no batch kept for its anatomy), and each tensor of the batch with its
    smallest lossless dtype."""

    wait_share: float
    ms_per_step: float
    verdict: Bound
    batch_bytes: int | None
    batches_per_step: float
    workers: int
    anatomy: tuple[dict[str, Any], ...]


@dataclass(frozen=True)
class RecompileRow:
    """A frame compiled again: the function, its file, the guard that failed, and whether the timed steps met it."""

    function: str
    path: str
    reason: str
    during_timed_steps: bool


@dataclass(frozen=True)
class CompileSummary:
    """torch.compile over the run: each distinct graph break, each frame compiled again, the seconds spent compiling
    (None: torch keeps no record), and why breaks or recompiles could not be read ("" when they could)."""

    graph_breaks: tuple[GraphBreakSite, ...]
    recompiles: tuple[RecompileRow, ...]
    compile_s: float | None
    unavailable: str = ""

    def as_json(self) -> dict[str, Any]:
        """The summary as the JSON report's ``compile`` entry."""
        return {"graph_breaks": [{"reason": b.reason, "path": b.path, "line": b.line, "explanation": b.explanation,
                                  "hint": b.hint} for b in self.graph_breaks],
                "recompiles": [asdict(r) for r in self.recompiles], "compile_s": self.compile_s,
                "unavailable": self.unavailable or None}


@dataclass(frozen=True)
class MemoryFigures:
    """Peak memory: the CUDA allocator's over the timed steps (max allocated; ``per_step_bytes``, the median of each
    step's peak), or the process group's over the memory steps (the sum of PSS; ``detail``: USS, processes, samples).
    """

    source: str
    peak_bytes: int | None
    per_step_bytes: int | None
    detail: str


@dataclass(frozen=True)
class CopyRow:
    """The copies of one kind at one line, per scanned step."""

    path: str | None
    line: int | None
    call: str
    direction: Direction
    pinned: bool
    blocking: bool
    per_step: float
    bytes_per_step: float
    code: str = ""
    function: str = ""


@dataclass(frozen=True)
class RealSyncRow:
    """One line's real CUDA syncs and hazards per step, and what its syncs stalled the host."""

    path: str
    line: int
    real_per_step: float
    hazards_per_step: float
    stall_ms_per_step: float


@dataclass(frozen=True)
class OneOff:
    """A cost paid once, not per step."""

    what: str
    seconds: float | None
    detail: str = ""


@dataclass(frozen=True)
class CudaOnCpuFigures:
    """What ``--cuda-on-cpu`` mapped: the device's name and compute capability as it answered, the devices the script
    saw, and the mapped calls by kind ("tensors moved to cuda", ...), the most first."""

    device: str
    capability: tuple[int, int]
    devices: int
    calls: tuple[tuple[str, int], ...]

    def as_json(self) -> dict[str, Any]:
        """The JSON report's ``cuda_on_cpu`` entry."""
        return {"device": self.device, "capability": list(self.capability), "devices": self.devices,
                "calls": dict(self.calls)}


@dataclass(frozen=True)
class DoctorReport:
    """What one run of a script under the doctor found.

    Attributes:
        ended: how the run ended ("its 18 steps are done", "the script ended after 7 steps", ...).
        failure: the script's error, when it raised before its steps were done.
        step_ms: (median, p90, mean) of the timed steps, or None when no step was timed.
        findings: ranked, the costliest first.
        loader: the loader's figures, or None when the timed steps iterated no DataLoader.
        memory: peak memory, or None when no step was timed.
        copies: every copy between host and device during the scanned steps.
        real_syncs: per line on a GPU, or None without one.
        bandwidth: copy bandwidth measured on the device, GB/s by kind (empty without a GPU).
        not_measured: each figure that was not measured, and why ("real syncs by line ...: no GPU").
        no_gpu: why the GPU's figures were not measured (`reasons.NO_GPU`, `reasons.SCRIPT_NO_GPU`), or "" when
            they were.
        digests: the digests of the first batches, when they were asked for (`DoctorOptions.digests`).
        cuda_on_cpu: what ``--cuda-on-cpu`` mapped, or None without it.
        ddp: DistributedDataParallel's communication per timed step (None: no DDP module, or no step timed).
        rank: the rank under torchrun (None: one process).
    """

    script: str
    argv: tuple[str, ...]
    steps: StepsDone
    ended: str
    failure: Failure | None
    step_ms: tuple[float, float, float] | None
    findings: tuple[Finding, ...]
    loader: LoaderFigures | None
    compile: CompileSummary
    memory: MemoryFigures | None
    copies: tuple[CopyRow, ...]
    real_syncs: tuple[RealSyncRow, ...] | None
    bandwidth: tuple[tuple[str, float], ...]
    one_off: tuple[OneOff, ...]
    not_measured: tuple[str, ...]
    wall_s: float
    no_gpu: str = NO_GPU
    digests: tuple[str, ...] = ()
    cuda_on_cpu: CudaOnCpuFigures | None = None
    ddp: DdpFigures | None = None
    rank: int | None = None

    @property
    def syncs_agree(self) -> bool | None:
        """Whether every line's real syncs equal its hazards (None without a GPU)."""
        return None if self.real_syncs is None else all(r.real_per_step == r.hazards_per_step for r in self.real_syncs)

    @property
    def explained(self) -> float | None:
        """The share of the mean step that the findings with a measured cost add up to (None: no step timed)."""
        if self.step_ms is None or not self.step_ms[2]:
            return None
        return sum(f.ms_per_step for f in self.findings if f.ms_per_step is not None) / self.step_ms[2]

    def finding_at(self, kind: FindingKind, path: str, line: int) -> tuple[Finding, ...]:
        """The findings of one kind at one line."""
        return tuple(f for f in self.findings if f.kind == kind and f.path == path and f.line == line)

    def as_json(self) -> dict[str, Any]:
        """The report as plain JSON values (see `pitfalls doctor --json`)."""
        return {
            "script": self.script,
            "argv": list(self.argv),
            "steps": asdict(self.steps),
            "ended": self.ended,
            "error": None if self.failure is None else {"last_line": self.failure.last_line,
                                                        "step": self.failure.step, "hint": self.failure.hint or None},
            "step_ms": (None if self.step_ms is None
                        else dict(zip(("median", "p90", "mean"), self.step_ms, strict=True))),
            "findings": [finding.as_json() for finding in self.findings],
            "loader": None if self.loader is None else asdict(self.loader),
            "compile": self.compile.as_json(),
            "memory": None if self.memory is None else asdict(self.memory),
            "copies": [asdict(row) for row in self.copies],
            "real_syncs": (f"not measured: {self.no_gpu}" if self.real_syncs is None
                           else [asdict(r) for r in self.real_syncs]),
            "syncs_agree": self.syncs_agree,
            "bandwidth_gb_s": dict(self.bandwidth) if self.bandwidth else f"not measured: {self.no_gpu}",
            "one_off": [asdict(o) for o in self.one_off],
            "explained_share": self.explained,
            "not_measured": list(self.not_measured),
            "wall_s": self.wall_s,
            "cuda_on_cpu": None if self.cuda_on_cpu is None else self.cuda_on_cpu.as_json(),
            "ddp": None if self.ddp is None else asdict(self.ddp),
            **({} if self.rank is None else {"rank": self.rank}),
        }

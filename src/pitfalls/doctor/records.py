"""What each phase of a run measured, one typed record a phase, made by `phases.Phases` when the phase ends (None: it
never ran; cut short: the steps it ran), and the whole run's records as the rules read them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from pitfalls.doctor.copies import Bandwidth, CopySite
from pitfalls.doctor.ddp_watch import DdpFigures
from pitfalls.doctor.definitions import Definitions
from pitfalls.doctor.report import LoaderFigures
from pitfalls.probes.anatomy import Anatomy
from pitfalls.probes.compiled import GraphBreakSite, Recompile
from pitfalls.probes.group_memory import GroupMemory
from pitfalls.probes.hostcopy import Provenance
from pitfalls.probes.sites import LocatedHazards, SourceLine
from pitfalls.result import Unavailable

__all__ = ["GpuRecord", "MemoryRecord", "Phase", "ScanContext", "ScanRecord", "Seen", "TimedRecord"]

# The phases of a run, in their order (`phases.schedule`).
Phase = Literal["warmup", "timed", "before_scan", "scanned", "memory", "gpu"]
_Instrument = TypeVar("_Instrument")
_Watch = TypeVar("_Watch")


@dataclass(frozen=True)
class ScanContext:
    """What an instrument of the scanned steps is made with.

    Attributes:
        provenance: the tensors the CUDA program would hold on the host, recorded since the first step.
        real_devices: the script runs on an accelerator: a tensor is on the host when it is on the CPU.
    """

    provenance: Provenance
    definitions: Definitions
    real_devices: bool


@dataclass(frozen=True)
class TimedRecord:
    """The timed steps.

    Attributes:
        step_s: each step's wall seconds (its device work synchronized where the script uses CUDA).
        wait_s: each step's seconds waiting in a DataLoader's ``next()``.
        workers: the most workers of a loader that delivered a batch.
        began: wall time (`time.time()`) the phase began; ``ended``, the time it ended.
        cuda_peaks: the CUDA allocator's peak of each step, bytes (a run on CUDA).
        ddp: DistributedDataParallel's communication per step (None: the script built no DDP module).
        loader_line: the script's line that asked for most of the timed steps' batches (None: no batch).
    """

    step_s: tuple[float, ...]
    wait_s: tuple[float, ...]
    batches: tuple[int, ...]
    workers: int
    began: float
    ended: float
    cuda_peaks: tuple[int, ...] = ()
    ddp: DdpFigures | None = None
    loader_line: SourceLine | None = None

    def during(self, when: float) -> bool:
        """Whether a wall time (`time.time()`) falls within the timed steps."""
        return self.began <= when <= self.ended


@dataclass(frozen=True)
class MemoryRecord:
    """The memory steps: the process group's memory (this process and its loader workers), sampled."""

    steps: int
    group: GroupMemory | Unavailable


@dataclass(frozen=True)
class ScanRecord:
    """The scanned steps: the hazards by line, the copies, the batches' anatomy, and every other instrument there.

    Attributes:
        steps: the steps scanned (counts per step are over these).
        anatomies: the batches' tensors and their smallest lossless dtypes, by the script's line that asked for them
            (a loader whose batches have no tensor or no fixed structure has none).
        batches: the batches delivered, by the line that asked for them.
        instruments: each instrument a rule asked for (`rule.Rule.instrument`), after the steps, by its maker.
    """

    steps: int
    hazards: LocatedHazards
    copies: tuple[CopySite, ...]
    anatomies: Mapping[SourceLine | None, Anatomy]
    batches: Mapping[SourceLine | None, int]
    instruments: Mapping[Callable[[ScanContext], Any], Any]

    def read(self, instrument: Callable[[ScanContext], _Instrument]) -> _Instrument:
        """The instrument a rule asked for, as it was after the scanned steps."""
        return self.instruments[instrument]


@dataclass(frozen=True)
class GpuRecord:
    """The GPU steps, under CUDA's sync debug mode: ``per_line`` {(path, line): (real syncs, stall ms) a step}."""

    steps: int
    per_line: Mapping[tuple[str, int], tuple[float, float]]


@dataclass(frozen=True)
class Seen:
    """What a whole run saw, as the rules read it: each phase's record (None: the phase never ran), and what the
    run's own watches saw from start to end.

    Attributes:
        loader: the loader's figures over the timed steps (None: they took no batch).
        loader_line: the script's line that asked for the timed steps' batches (or, with none timed, the first).
        bandwidth: the device's copy bandwidth (None without a GPU).
        no_gpu: why the GPU's figures were not measured ("" when they were).
        step_functions: the script's functions on the stack at the first step's end (its loop).
        watches: each watch of the whole run a rule asked for (`rule.Rule.watch`), after the run, by its maker.
    """

    timed: TimedRecord | None
    scan: ScanRecord | None
    gpu: GpuRecord | None
    memory: MemoryRecord | None
    loader: LoaderFigures | None
    loader_line: SourceLine | None
    graph_breaks: tuple[GraphBreakSite, ...]
    recompiles: tuple[Recompile, ...]
    bandwidth: Bandwidth | None
    no_gpu: str
    step_functions: frozenset[tuple[str, str]]
    watches: Mapping[Callable[[], Any], Any]

    def scanned(self, instrument: Callable[[ScanContext], _Instrument]) -> tuple[_Instrument | None, int]:
        """The instrument a rule asked for, as it was after the scanned steps, and their number ((None, 0): no step
        was scanned)."""
        if self.scan is None or self.scan.steps == 0:
            return None, 0
        return self.scan.read(instrument), self.scan.steps

    def watched(self, watch: Callable[[], _Watch]) -> _Watch:
        """The watch of the whole run a rule asked for, as it was after the run."""
        return self.watches[watch]

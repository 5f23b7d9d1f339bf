"""The phases of a run: a state machine moved at each step's end, each phase with its own instruments, so that none
disturbs another's figure; `schedule` is the one place their order and lengths are decided, and a phase's instruments
become its typed record (`records`) when it ends (docs/doctor.md, "What it runs").
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from collections import Counter
from typing import Any, NoReturn

import torch
from torch.utils._pytree import tree_flatten, tree_map

from pitfalls.doctor import rules
from pitfalls.doctor.copies import CopyRecorder
from pitfalls.doctor.ddp_watch import DdpWatch
from pitfalls.doctor.definitions import Definitions
from pitfalls.doctor.options import BEFORE_SCAN_STEPS, DoctorOptions
from pitfalls.doctor.ranks import Ranks
from pitfalls.doctor.real_syncs import RealSyncs
from pitfalls.doctor.records import GpuRecord, MemoryRecord, Phase, ScanContext, ScanRecord, TimedRecord
from pitfalls.probes.anatomy import Anatomy, anatomy
from pitfalls.probes.group_memory import GroupMemorySampler
from pitfalls.probes.hostcopy import Provenance, keep_provenance
from pitfalls.probes.sites import HazardLocator, SourceLine

__all__ = ["Phases", "StopRun", "batch_digest", "schedule"]

# Reading every process's memory map costs the step time it shares the cores with: 50 ms, as scan-loader samples.
MEMORY_INTERVAL_S = 0.05
# Batches kept (copied) from the scanned steps, a loader's line, for the batch's anatomy.
ANATOMY_BATCHES = 3
# What each phase measures, to name a phase that did not run in full.
_MEASURES: dict[Phase, str] = {
    "warmup": "the warm-up steps",
    "timed": "the timed steps (step time, the loader's wait)",
    "before_scan": "the step before the scan",
    "scanned": "the scanned steps (sync hazards and copies by line, the rules)",
    "memory": "the memory steps (the process group's memory)",
    "gpu": "the GPU steps (real syncs by line, their stalls)",
}


class StopRun(BaseException):
    """Raised into the script to stop it; `reason` says why ("its steps are done", "the budget ...")."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def schedule(options: DoctorOptions, on_cuda: bool) -> tuple[tuple[Phase, int], ...]:
    """The phases a run takes, in order, and the steps of each.

    Args:
        options: the steps asked for.
        on_cuda: the script initialized CUDA: the GPU steps end the run (under CUDA's sync debug mode), else the
            memory steps (the allocator's peaks come with the timed steps on CUDA).

    Returns:
        (phase, steps) pairs; a `--try` trial stops after its timed steps.
    """
    o = options
    if o.trial:
        return ("warmup", o.warmup), ("timed", o.steps)
    last: tuple[Phase, int] = ("gpu", o.scanned) if on_cuda else ("memory", o.memory)
    taken: tuple[tuple[Phase, int], ...] = (
        ("warmup", o.warmup), ("timed", o.steps), ("before_scan", BEFORE_SCAN_STEPS), ("scanned", o.scanned), last)
    return tuple((phase, steps) for phase, steps in taken if steps)


def _cuda() -> bool:
    # is_initialized, never is_available: nothing of CUDA starts before the script starts it.
    return bool(torch.cuda.is_initialized())


def _copy(batch: Any) -> Any:
    return tree_map(lambda leaf: leaf.detach().clone() if isinstance(leaf, torch.Tensor) else leaf, batch)


def batch_digest(batch: Any) -> str:
    """The SHA-256 of a batch (each tensor's dtype, shape and bytes, each other leaf's repr), to tell runs apart."""
    digest = hashlib.sha256()
    for leaf in tree_flatten(batch)[0]:
        if isinstance(leaf, torch.Tensor):
            digest.update(f"{leaf.dtype}{tuple(leaf.shape)}".encode())
            digest.update(leaf.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        else:
            digest.update(repr(leaf).encode())
    return digest.hexdigest()


def _makes_state(optimizer: torch.optim.Optimizer, stepped_before: bool, had_state: bool) -> bool:
    """Whether an optimizer's coming step may make new state: its first step, or, for an optimizer that keeps
    state, a parameter with a gradient and no state yet."""
    if not stepped_before:
        return True
    if not had_state:
        return False  # plain SGD: its first step made none, and no later one will
    state = optimizer.state
    return any(p.grad is not None and p not in state for group in optimizer.param_groups for p in group["params"])


def _anatomy(batches: list[Any]) -> Anatomy | None:
    try:
        return anatomy(batches)
    except (ValueError, TypeError):  # a batch with no tensor, or tensors of no fixed structure
        return None


class Phases:
    """Move a run through its phases at each step's end; ``ranks``: the other ranks, under torchrun, met at each
    phase's end. Each phase's record is in the attribute of its name once it has ended (`timed`, `scan`, `memory`,
    `gpu`); `ran` holds the steps each phase ran."""

    def __init__(self, options: DoctorOptions, ranks: Ranks | None = None) -> None:
        self.options = options
        self.ranks = ranks
        self.definitions = Definitions()
        self.ddp = DdpWatch()
        self.provenance = Provenance()
        self.schedule = schedule(options, on_cuda=False)
        self.phase: Phase | None = None
        self.ran: dict[Phase, int] = {}
        self.timed: TimedRecord | None = None
        self.scan: ScanRecord | None = None
        self.memory: MemoryRecord | None = None
        self.gpu: GpuRecord | None = None
        self.on_cuda = False
        self.done = False  # every phase ran its steps
        self.digests: list[str] = []
        self.first_step_s: float | None = None
        self.began = time.perf_counter()
        self._index = -1
        self._from = 0  # the steps done when the current phase began
        self._stack: contextlib.ExitStack | None = None
        self._instruments: dict[Any, Any] = {}
        self._state_record: contextlib.ExitStack | None = None
        self._optimizers: dict[int, bool] = {}  # id of an optimizer that stepped -> whether it keeps state
        self._last = 0.0
        self._wait = 0.0
        self._batches = 0
        # What the current phase gathers step by step.
        self._steps: list[tuple[float, float, int, int]] = []  # timed: (seconds, wait, batches, CUDA peak)
        self._workers = 0
        self._began_wall = 0.0
        self._asked: Counter[SourceLine | None] = Counter()  # timed: the batches asked for, by line
        self._kept: dict[SourceLine | None, list[Any]] = {}  # scanned: batches copied for their anatomy, by line
        self._delivered: Counter[SourceLine | None] = Counter()

    # -- what the loader watch asks -----------------------------------------------------------------------------

    def instruments_on(self) -> bool:
        """Whether an instrument that watches torch calls (a torch function or dispatch mode) is on now."""
        return bool(self._instruments) and self.phase != "memory"  # every instrument but the memory sampler

    def batch_arrived(self, seconds: float, workers: int, batch: Any, pinned: bool, line: SourceLine | None) -> None:
        """A batch came out of a DataLoader after ``seconds`` in ``next()``, asked for at ``line``; ``pinned``: its
        loader asked for pinned memory."""
        if self.phase == "timed":
            self._wait += seconds
            self._batches += 1
            self._workers = max(self._workers, workers)
            self._asked[line] += 1
        self.provenance.add(batch)  # made by the loader on the host, as on a GPU, whatever the phase
        if pinned:
            self.provenance.pin(batch)
        if len(self.digests) < self.options.digests:
            self.digests.append(batch_digest(batch))
        if self.phase == "scanned":
            self._delivered[line] += 1
            kept = self._kept.setdefault(line, [])
            if len(kept) < ANATOMY_BATCHES:
                kept.append(_copy(batch))

    def optimizer_stepping(self, optimizer: torch.optim.Optimizer) -> None:
        """An optimizer's step begins: record what it makes on the host where it may make new state."""
        key = id(optimizer)
        if self.instruments_on() or self._state_record is not None or not _makes_state(
                optimizer, key in self._optimizers, self._optimizers.get(key, False)):
            return
        with contextlib.ExitStack() as stack:
            stack.enter_context(keep_provenance(self.provenance))
            self._state_record = stack.pop_all()

    def optimizer_stepped(self, optimizer: torch.optim.Optimizer) -> None:
        """An optimizer's step ended: leave the record its start entered."""
        self._leave_state_record()
        self._optimizers[id(optimizer)] = self._optimizers.get(id(optimizer), False) or bool(optimizer.state)

    def _leave_state_record(self) -> None:
        record, self._state_record = self._state_record, None
        if record is not None:
            record.close()

    # -- the state machine ----------------------------------------------------------------------------------------

    def first_step_started(self) -> None:
        """The script's first step starts: the warm-up, its first step run eagerly under the provenance record."""
        self._next(0)

    def step_ended(self, steps: int) -> None:
        """``steps`` steps are done: record, move on, or stop the run with `StopRun`."""
        if self.phase == "timed" and self.on_cuda:
            torch.cuda.synchronize()  # the step's device work is part of its time
        now = time.perf_counter()
        if steps == 1:
            self.first_step_s = now - self.began
            self._leave()  # the first step's provenance is kept; the warm-up goes on without instruments
        if self.phase == "timed":
            peak = 0
            if self.on_cuda:
                peak = int(torch.cuda.max_memory_allocated())
                torch.cuda.reset_peak_memory_stats()
            self._steps.append((now - self._last, self._wait, self._batches, peak))
            self.ddp.sample()
        self._wait, self._batches = 0.0, 0
        if steps - self._from == self.schedule[self._index][1]:
            self._end(steps)
            self._next(steps)
        self._last = time.perf_counter()

    def finish(self, steps: int) -> None:
        """Leave whatever phase a stopped or failed run was in, keeping what it measured over the steps it ran."""
        self._leave_state_record()  # an optimizer's step that raised
        if self.phase is not None:
            self._end(steps)

    def _next(self, steps: int) -> None:
        """Enter the next phase of the schedule, or stop the run after the last; under torchrun, once every rank has
        ended the phase before."""
        self.schedule = schedule(self.options, self.on_cuda or _cuda())
        self._index += 1
        if self._index == len(self.schedule):
            self.phase = None
            self._done(steps)
        if self.ranks is not None:
            stopped = self.ranks.barrier(self.schedule[self._index][0])
            if stopped is not None:
                self.phase = None
                raise StopRun(stopped)
        self.phase, self._from = self.schedule[self._index][0], steps
        if self.phase == "warmup":
            self._enter({"keep": keep_provenance(self.provenance)})
        elif self.phase == "timed":
            self.on_cuda = _cuda()
            self._began_wall = time.time()
            self.ddp.start()
            if self.on_cuda:
                torch.cuda.reset_peak_memory_stats()
        elif self.phase == "before_scan":
            self._enter({"keep": keep_provenance(self.provenance)})
        elif self.phase == "scanned":
            self.on_cuda = _cuda()
            context = ScanContext(self.provenance, self.definitions, real_devices=self.on_cuda)
            # The copy recorder sits on top of the hazard counter's modes; the rules' instruments on top of both.
            self._enter({HazardLocator: HazardLocator(provenance=self.provenance),
                         CopyRecorder: CopyRecorder(self.provenance, real_devices=self.on_cuda),
                         **{make: make(context) for make in rules.instruments()}})
        elif self.phase == "memory":
            self._enter({GroupMemorySampler: GroupMemorySampler(os.getpid(), interval_s=MEMORY_INTERVAL_S)})
        else:
            self._enter({RealSyncs: RealSyncs(time.perf_counter)})

    def _end(self, steps: int) -> None:
        """Leave the current phase's instruments and keep what they measured as its record."""
        instruments, phase, done = self._leave(), self.phase, steps - self._from
        assert phase is not None
        self.ran[phase] = done
        if phase == "timed" and self._steps:
            step_s, wait_s, batches, peaks = (tuple(column) for column in zip(*self._steps, strict=True))
            self.timed = TimedRecord(step_s, wait_s, batches, self._workers, self._began_wall, time.time(),
                                     peaks if self.on_cuda else (), self.ddp.figures(),
                                     self._asked.most_common(1)[0][0] if self._asked else None)
        elif phase == "scanned" and done:
            self.scan = ScanRecord(
                done, instruments.pop(HazardLocator).result, instruments.pop(CopyRecorder).sites,
                {line: shape for line, kept in self._kept.items() if (shape := _anatomy(kept)) is not None},
                dict(self._delivered), instruments)
            self._kept.clear()  # the copies of the batches would weigh in the memory steps that follow
        elif phase == "memory" and done:
            self.memory = MemoryRecord(done, instruments[GroupMemorySampler].result)
        elif phase == "gpu" and done:
            self.gpu = GpuRecord(done, instruments[RealSyncs].per_line(done))
        self.phase = None

    def _done(self, steps: int) -> NoReturn:
        self.done = True
        raise StopRun(f"its {steps} steps are done")

    def short(self, steps: int) -> tuple[str, ...]:
        """A sentence for each phase of the schedule that did not run all its steps, with the steps it needed and
        the steps the script ran (``steps``)."""
        found, first = [], 1
        for phase, wanted in self.schedule:
            ran = self.ran.get(phase, 0)
            span = f"steps {first} to {first + wanted - 1}" if wanted > 1 else f"step {first}"
            if ran == 0:
                found.append(f"{_MEASURES[phase]}: not run: they needed {span}, and the script ran {steps} step(s)")
            elif ran < wanted:
                found.append(f"{_MEASURES[phase]}: {ran} of {wanted} ({span}): the script ran {steps} step(s)")
            first += wanted
        return tuple(found)

    def _enter(self, instruments: dict[Any, Any]) -> None:
        with contextlib.ExitStack() as stack:
            self._instruments = {key: stack.enter_context(cm) for key, cm in instruments.items()}
            self._stack = stack.pop_all()

    def _leave(self) -> dict[Any, Any]:
        stack, instruments = self._stack, self._instruments
        self._stack, self._instruments = None, {}
        if stack is not None:
            stack.close()
        return instruments

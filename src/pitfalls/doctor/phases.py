"""The phases of a run, each with its own instruments, so that none disturbs another's figure (docs/doctor.md, "What
it runs", says what each reads and why): warm-up, its first step eager under the provenance record (`keep_provenance`:
an optimizer's host-side step count is made there); timed; memory (`pitfalls.probes.group_memory`, only where the
script did not initialize CUDA); the step before the scan, under the record again; scanned (`HazardLocator` fed the
provenance kept so far, the copy recorder, `rules.RuleWatch`); and GPU (`gpu.RealSyncs`, only where the script
initialized CUDA).

Whatever the phase, the loader's own work runs with no instrument on and its batches are recorded as host-made
tensors; an optimizer's step that may make new state runs under the provenance record.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from dataclasses import dataclass, field
from typing import Any, NoReturn

import torch
from torch.utils._pytree import tree_flatten, tree_map

from pitfalls.doctor.copies import CopyRecorder, CopySite
from pitfalls.doctor.gpu import RealSyncs
from pitfalls.doctor.options import DoctorOptions
from pitfalls.doctor.rules import Definitions, RuleWatch
from pitfalls.probes.group_memory import GroupMemory, GroupMemorySampler
from pitfalls.probes.hostcopy import Provenance, keep_provenance
from pitfalls.probes.sites import HazardLocator, LocatedHazards
from pitfalls.result import Unavailable

__all__ = ["Phases", "StopRun", "Timed"]

SETUP, WARMUP, TIMED, MEMORY, BRIDGE = "setup", "warm-up", "timed", "memory", "before the scan"
SCANNED, GPU, DONE = "scanned", "gpu", "done"
# Reading every process's memory map costs the step time it shares the cores with: 50 ms, as scan-loader samples.
MEMORY_INTERVAL_S = 0.05
# Batches kept (copied) from the scanned steps for the batch's anatomy.
ANATOMY_BATCHES = 3


class StopRun(BaseException):
    """Raised into the script to stop it; `reason` says why ("its steps are done", "the budget ...")."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class Timed:
    """What the timed steps measured (filled as they run).

    Attributes:
        step_s: each step's wall seconds.
        wait_s: each step's seconds waiting in a DataLoader's ``next()``.
        batches: each step's batches.
        workers: the most workers of a loader that delivered a batch.
        began: wall time (`time.time()`) the phase began; None if it never did.
        ended: wall time it ended.
        cuda_peaks: the CUDA allocator's peak of each step, bytes (a run on CUDA).
    """

    step_s: list[float] = field(default_factory=list)
    wait_s: list[float] = field(default_factory=list)
    batches: list[int] = field(default_factory=list)
    workers: int = 0
    began: float | None = None
    ended: float | None = None
    cuda_peaks: list[int] = field(default_factory=list)

    def during(self, when: float) -> bool:
        """Whether a wall time (`time.time()`) falls within the timed steps."""
        return self.began is not None and self.ended is not None and self.began <= when <= self.ended


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


class Phases:
    """Move a run through its phases at each step's end, entering and leaving each phase's instruments; ``options``:
    the steps of each phase. `definitions` records where the script made its optimizers and convolutions."""

    def __init__(self, options: DoctorOptions) -> None:
        self.options = options
        self.definitions = Definitions()
        self.phase = SETUP
        self.provenance = Provenance()
        self.timed = Timed()
        self.group_memory: GroupMemory | Unavailable | None = None
        self.memory_steps = 0
        self.located: LocatedHazards | None = None
        self.scanned_steps = 0
        self.copies: tuple[CopySite, ...] = ()
        self.rules: RuleWatch | None = None
        self.real: RealSyncs | None = None
        self.gpu_steps = 0
        self.on_cuda = False
        self.anatomy_batches: list[Any] = []
        self.digests: list[str] = []
        self.first_step_s: float | None = None
        self.began = time.perf_counter()
        self._stack: contextlib.ExitStack | None = None
        self._instruments: dict[str, Any] = {}
        self._state_record: contextlib.ExitStack | None = None
        self._optimizers: dict[int, bool] = {}  # id of an optimizer that stepped -> whether it keeps state
        self._last = 0.0
        self._wait = 0.0
        self._batches = 0
        o = options
        self._timed_from, self._memory_from = o.warmup, o.warmup + o.steps
        self._from_bridge(self._memory_from + o.memory)

    def _from_bridge(self, bridge: int) -> None:
        """Where the phases after the timed ones start: the memory phase's length is known at the timed end."""
        o = self.options
        self._bridge_from = bridge
        self._scan_from = self._bridge_from + o.bridge
        self._scan_to = self._scan_from + o.scanned
        self._gpu_to = self._scan_to + o.scanned

    # -- what the loader watch asks -----------------------------------------------------------------------------

    def instruments_on(self) -> bool:
        """Whether an instrument that watches torch calls (a torch function or dispatch mode) is on now."""
        return any(name != "memory" for name in self._instruments)  # every instrument but the memory sampler

    def batch_arrived(self, seconds: float, workers: int, batch: Any, pinned: bool = False) -> None:
        """A batch came out of a DataLoader after ``seconds`` in ``next()``; ``pinned``: its loader asked for pinned
        memory."""
        if self.phase == TIMED:
            self._wait += seconds
            self._batches += 1
            self.timed.workers = max(self.timed.workers, workers)
        self.provenance.add(batch)  # made by the loader on the host, as on a GPU, whatever the phase
        if pinned:
            self.provenance.pin(batch)
        if len(self.digests) < self.options.digests:
            self.digests.append(batch_digest(batch))
        if self.phase == SCANNED and len(self.anatomy_batches) < ANATOMY_BATCHES:
            self.anatomy_batches.append(_copy(batch))

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

    # -- the phases -----------------------------------------------------------------------------------------------

    def _enter(self, **instruments: Any) -> None:
        with contextlib.ExitStack() as stack:
            self._instruments = {name: stack.enter_context(cm) for name, cm in instruments.items()}
            self._stack = stack.pop_all()

    def _leave(self) -> dict[str, Any]:
        stack, instruments = self._stack, self._instruments
        self._stack, self._instruments = None, {}
        if stack is not None:
            stack.close()
        return instruments

    def first_step_started(self) -> None:
        """The script's first step starts: it runs eagerly while its host-made tensors are recorded."""
        self.phase = WARMUP
        self._enter(keep=keep_provenance(self.provenance))

    def _stop(self, steps: int) -> None:
        """Leave the phase's instruments, keeping what they measured; ``steps``: the steps done so far."""
        instruments = self._leave()
        if self.phase == TIMED:
            self.timed.ended = time.time()
        elif self.phase == MEMORY and isinstance(instruments.get("memory"), GroupMemorySampler):
            self.group_memory = instruments["memory"].result
            self.memory_steps = steps - self._memory_from
        elif self.phase == SCANNED:
            self.scanned_steps = steps - self._scan_from
            self.located = instruments["locator"].result
            self.copies = instruments["copies"].sites
            self.rules = instruments["rules"]
        elif self.phase == GPU:
            self.real = instruments["real"]
            self.gpu_steps = steps - self._scan_to

    def _done(self, steps: int) -> NoReturn:
        self.phase = DONE
        raise StopRun(f"its {steps} steps are done")

    def step_ended(self, steps: int) -> None:
        """``steps`` steps are done: record, move on, or stop the run with `StopRun`."""
        if self.phase == TIMED and self.on_cuda:
            torch.cuda.synchronize()  # the step's device work is part of its time
        now = time.perf_counter()
        if steps == 1:
            self.first_step_s = now - self.began
            self._leave()  # the first step's provenance is kept; the warm-up goes on without instruments
        if self.phase == TIMED:
            self.timed.step_s.append(now - self._last)
            self.timed.wait_s.append(self._wait)
            self.timed.batches.append(self._batches)
            if self.on_cuda:
                self.timed.cuda_peaks.append(int(torch.cuda.max_memory_allocated()))
                torch.cuda.reset_peak_memory_stats()
        if steps == self._timed_from:
            self.phase = TIMED
            self.on_cuda = _cuda()
            self.timed.began = time.time()
            if self.on_cuda:
                torch.cuda.reset_peak_memory_stats()
        self._wait, self._batches = 0.0, 0
        if steps == self._memory_from:
            self._stop(steps)
            if self.options.trial:
                self._done(steps)
            if self.on_cuda:  # the allocator's peaks came with the timed steps
                self._from_bridge(steps)
            else:
                self.phase = MEMORY
                self._enter(memory=GroupMemorySampler(os.getpid(), interval_s=MEMORY_INTERVAL_S))
        if steps == self._bridge_from:
            if self.phase == MEMORY:
                self._stop(steps)
            self.phase = BRIDGE
            self._enter(keep=keep_provenance(self.provenance))
        if steps == self._scan_from:
            self._leave()
            self.phase = SCANNED
            self.on_cuda = _cuda()
            self._enter(locator=HazardLocator(provenance=self.provenance),
                        copies=CopyRecorder(self.provenance, real_devices=self.on_cuda),
                        rules=RuleWatch(self.definitions, self.provenance))
        if steps == self._scan_to:
            self._stop(steps)
            if not _cuda():
                self._done(steps)
            self.phase = GPU
            self._enter(real=RealSyncs(time.perf_counter))
        if steps == self._gpu_to:
            self._stop(steps)
            self._done(steps)
        self._last = time.perf_counter()

    def finish(self, steps: int) -> None:
        """Leave whatever phase a stopped or failed run was in, keeping what it measured over its whole steps."""
        self._leave_state_record()  # an optimizer's step that raised
        self._stop(steps)
        self.phase = DONE

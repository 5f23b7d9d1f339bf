"""Steps of an unchanged script: counted at the first optimizer's step, or at the loader's batches, and stopped by
raising `StopRun`, which the script's ``except Exception`` cannot swallow (docs/doctor.md, "Steps").
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from collections.abc import Iterator
from types import FrameType
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from pitfalls.doctor.phases import Phases, StopRun
from pitfalls.doctor.report import CountedBy
from pitfalls.probes.sites import is_user_file

__all__ = ["LOADER", "OPTIMIZER", "Budget", "StepCounter"]

OPTIMIZER: CountedBy = "optimizer"
LOADER: CountedBy = "loader"


def _user_functions(frame: FrameType | None) -> frozenset[tuple[str, str]]:
    """The script's functions on the stack, as (file, function) pairs: where its step is written."""
    found = set()
    while frame is not None:
        if is_user_file(frame.f_code.co_filename):
            found.add((frame.f_code.co_filename, frame.f_code.co_name))
        frame = frame.f_back
    return frozenset(found)


class Budget:
    """Stop the script after ``seconds`` of wall time wherever it is, by SIGALRM where this is the main thread.

    The doctor's own bookkeeping runs inside `busy`: an alarm that rings there is held until it is done, so an
    instrument is never left half entered. Once rung, it rings again every second, for a script that swallows even
    BaseException; every step's end raises again too.
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.reason = f"the budget of {seconds:g} s was spent"  # why the run stops when the budget is spent
        self._deadline = time.monotonic() + seconds
        self._busy = 0
        self._pending = False
        self._previous: Any = None
        self._armed = False

    def _ring(self, _signum: int, _frame: FrameType | None) -> None:
        if self._busy:
            self._pending = True
            return
        raise StopRun(self.reason)

    def __enter__(self) -> Budget:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGALRM, self._ring)
            signal.setitimer(signal.ITIMER_REAL, self.seconds, 1.0)
            self._armed = True
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._armed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self._previous)
            self._armed = False

    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        """Hold the alarm for the block; raise `StopRun` after it if the alarm rang or the budget is spent."""
        self._busy += 1
        try:
            yield
        finally:
            self._busy -= 1
        if not self._busy and (self._pending or time.monotonic() >= self._deadline):
            self._pending = False
            raise StopRun(self.reason)


class StepCounter:
    """Count the script's steps and report each step's start and end, and each optimizer's step, to the phases;
    ``budget`` is held while the counter's own work runs. `step_functions` holds the script's functions on the stack
    at the first step's end, so a hazard in any other function is inside a helper the step calls."""

    def __init__(self, budget: Budget, phases: Phases) -> None:
        self._budget = budget
        self._phases = phases
        self.by: CountedBy | None = None
        self.steps = 0
        self.batches = 0
        self._delivered = False
        self.step_started = False
        self._pacing: torch.optim.Optimizer | None = None
        self._stopping: StopRun | None = None
        self._handles: list[Any] = []
        self.step_functions: frozenset[tuple[str, str]] = frozenset()

    def __enter__(self) -> StepCounter:
        self._handles = [register_optimizer_step_pre_hook(self._pre), register_optimizer_step_post_hook(self._post)]
        return self

    def __exit__(self, *exc_info: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._pacing = None

    def _start(self) -> None:
        if not self.step_started:
            self.step_started = True
            self._phases.first_step_started()

    def _end_step(self) -> None:
        if self._stopping is not None:
            raise self._stopping  # the script swallowed the first one
        if not self.step_functions:
            self.step_functions = _user_functions(sys._getframe(1))
        self.steps += 1
        try:
            self._phases.step_ended(self.steps)
        except StopRun as stop:
            self._stopping = stop
            raise

    def _pre(self, optimizer: torch.optim.Optimizer, _args: object, _kwargs: object) -> None:
        with self._budget.busy():
            if self.by != LOADER:
                self._start()
            if self.step_started:
                self._phases.optimizer_stepping(optimizer)

    def _post(self, optimizer: torch.optim.Optimizer, _args: object, _kwargs: object) -> None:
        with self._budget.busy():
            # First: what the optimizer's step entered is left before the step's end moves the phases.
            self._phases.optimizer_stepped(optimizer)
            if self.by == LOADER:
                return
            if self._pacing is None:
                self._pacing, self.by = optimizer, OPTIMIZER
            if optimizer is self._pacing:
                self._end_step()

    def batch_asked(self) -> None:
        """A DataLoader iterator was asked for its next batch: in a script without an optimizer, the step that took
        the last batch ends (an ask that ends an epoch delivers none, and ends no step)."""
        with self._budget.busy():
            if self.by is None and self.batches >= 1 and not self._phases.definitions.optimizers_made:
                self.by = LOADER
            if self.by == LOADER and self._delivered:
                self._delivered = False
                self._end_step()
            self._start()

    def batch_delivered(self) -> None:
        """A DataLoader iterator delivered a batch."""
        self.batches += 1
        self._delivered = True

"""One batch delivered: copied to the device (non-blocking when pinned), the user's step, a synchronize."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from functools import partial
from typing import Any

import torch

from pitfalls.devices import synchronize
from pitfalls.families.loader.workers import BROKEN_CONNECTION_S, WorkerDied, exited, is_handler_report
from pitfalls.scan_loader.interrupts import raise_if_received
from pitfalls.scan_loader.rebuild import worker_pids
from pitfalls.scan_loader.target import Step
from pitfalls.targets import ScannedCodeError, call_scanned

__all__ = ["Delivery", "theirs", "to_device"]


def to_device(batch: Any, device: torch.device, non_blocking: bool) -> Any:
    """The batch with every tensor on ``device``, its structure (tuples, lists, dicts) kept."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, Mapping):
        return {key: to_device(value, device, non_blocking) for key, value in batch.items()}
    if isinstance(batch, (list, tuple)) and not hasattr(batch, "_fields"):
        return type(batch)(to_device(value, device, non_blocking) for value in batch)
    return batch


class Delivery:
    """Copy a batch to the device and run the step on it, synchronized; the step's errors marked as the user's.

    Args:
        device: where batches go.
        step: the user's step, or None for a step of zero cost.
        step_name: how errors name it.
    """

    def __init__(self, device: torch.device, step: Step | None, step_name: str) -> None:
        self.device = device
        self.step = step
        self.step_name = step_name
        self.non_blocking = False

    def __call__(self, batch: Any) -> None:
        moved = to_device(batch, self.device, self.non_blocking)
        if self.step is not None:
            call_scanned(self.step_name, "running the step", partial(self.step, moved))
        synchronize(self.device)


def theirs(target: str, iterator: Iterator[Any]) -> Iterator[Any]:
    """The loader's batches; an exception raised while making one is the user's, a dead worker is `WorkerDied`, and a
    Ctrl-C that a finalizer swallowed is raised before the next batch."""
    while True:
        raise_if_received()
        try:
            batch = next(iterator)
        except StopIteration:
            return
        except Exception as error:
            if isinstance(error, RuntimeError) and is_handler_report(error):
                raise WorkerDied(str(error).splitlines()[0]) from error
            # A broken connection is a dead worker's when one has exited; otherwise the user's code raised it.
            dead = exited(worker_pids(iterator, live=False), wait_s=BROKEN_CONNECTION_S) \
                if isinstance(error, (OSError, EOFError)) else []
            if dead:
                raise WorkerDied(f"DataLoader worker (pid {', '.join(map(str, dead))}) exited unexpectedly "
                                 f"({type(error).__name__}: {error})") from error
            raise ScannedCodeError(target, "loading a batch", error) from error
        yield batch

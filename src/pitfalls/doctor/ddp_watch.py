"""DistributedDataParallel's communication, read from DDP itself: every DDP module the script builds, the forwards
that prepare an all-reduce of the gradients, counted step by step, and DDP's own logging data sampled every iteration
(docs/doctor.md, "Under torchrun: every rank, one report").
"""

from __future__ import annotations

import contextlib
import functools
import statistics
import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

__all__ = ["DdpFigures", "DdpWatch"]

_NS_PER_MS = 1e6


@dataclass(frozen=True)
class DdpFigures:
    """DDP's communication per timed step: the modules, their gradients' buckets and bytes, the syncing backwards
    (outside ``no_sync``) and bytes a step, and an iteration's backward compute, all-reduce and the overlap of the two
    in ms (DDP's logging data, over the sampled iterations)."""

    modules: int
    buckets: int
    bucket_bytes: int
    reductions_per_step: float
    bytes_per_step: float
    compute_ms: float | None
    comm_ms: float | None
    overlap_ms: float | None
    samples: int


def _sizes(data: dict[str, Any]) -> list[int]:
    text = str(data.get("rebuilt_bucket_sizes") or data.get("bucket_sizes") or "")
    return [int(size) for size in text.replace(",", " ").split()]


class DdpWatch:
    """Watch every DDP module the script builds, for the block."""

    def __init__(self) -> None:
        self._modules: weakref.WeakSet[DistributedDataParallel] = weakref.WeakSet()
        self._undo = contextlib.ExitStack()
        self.reductions = 0  # syncing forwards so far
        self._seen: dict[int, int] = {}  # id of a module -> the last iteration sampled
        self._samples: list[tuple[int, int, int]] = []  # (compute, comm, overlap) ns of each iteration sampled
        self._steps: list[int] = []  # syncing forwards of each sampled step
        self._at_step = 0

    def __enter__(self) -> DdpWatch:
        watch = self
        init, forward = DistributedDataParallel.__init__, DistributedDataParallel.forward

        @functools.wraps(init)
        def made(module: DistributedDataParallel, *args: Any, **kwargs: Any) -> None:
            init(module, *args, **kwargs)
            watch._modules.add(module)
            module._set_ddp_runtime_logging_sample_rate(1)

        @functools.wraps(forward)
        def forwarded(module: DistributedDataParallel, *args: Any, **kwargs: Any) -> Any:
            if torch.is_grad_enabled() and module.require_backward_grad_sync:
                watch.reductions += 1
            return forward(module, *args, **kwargs)

        self._undo.callback(setattr, DistributedDataParallel, "__init__", init)
        self._undo.callback(setattr, DistributedDataParallel, "forward", forward)
        DistributedDataParallel.__init__ = made  # type: ignore[method-assign,assignment]
        DistributedDataParallel.forward = forwarded  # type: ignore[method-assign,assignment]
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._undo.close()

    def start(self) -> None:
        """The timed steps begin: samples are kept from here."""
        self._at_step = self.reductions

    def sample(self) -> None:
        """A timed step ended: keep its syncing forwards and the iteration each module logged last (DDP logs one at
        the next syncing forward)."""
        self._steps.append(self.reductions - self._at_step)
        self._at_step = self.reductions
        for module in list(self._modules):
            data = module._get_ddp_logging_data()
            iteration = int(data.get("iteration", -1))
            if iteration > self._seen.get(id(module), -1) and "backward_comm_time" in data:
                self._seen[id(module)] = iteration
                self._samples.append((int(data["backward_compute_time"]), int(data["backward_comm_time"]),
                                      int(data["backward_compute_comm_overlap_time"])))

    def figures(self) -> DdpFigures | None:
        """The communication per timed step, or None where no DDP module was built or no step was sampled."""
        modules = list(self._modules)
        if not modules or not self._steps:
            return None
        sizes = [size for module in modules for size in _sizes(module._get_ddp_logging_data())]
        per_step = statistics.fmean(self._steps)

        def mean_ms(column: int) -> float | None:
            return statistics.fmean(s[column] for s in self._samples) / _NS_PER_MS if self._samples else None

        return DdpFigures(len(modules), len(sizes), sum(sizes), per_step, per_step * sum(sizes), mean_ms(0),
                          mean_ms(1), mean_ms(2), len(self._samples))

"""DistributedDataParallel's communication, read from DDP itself: every DDP module the script builds, the forwards
that prepare an all-reduce of the gradients, and DDP's own logging data sampled every step.

`torch.nn.parallel.DistributedDataParallel.__init__` and ``forward`` are wrapped for the run and restored after it.
A forward run with grad enabled while ``require_backward_grad_sync`` holds (outside ``no_sync()``) prepares the
reducer, so the backward that follows all-reduces every bucket: those forwards are counted, step by step. Each
module's runtime logging is sampled at every iteration (`_set_ddp_runtime_logging_sample_rate(1)`; DDP's default
samples one in 100), and `_get_ddp_logging_data()` read at each timed step's end gives the backward's compute,
communication and overlap times of the iteration DDP last logged (it logs one at the next syncing forward) and the
buckets' sizes.
"""

from __future__ import annotations

import functools
import statistics
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

__all__ = ["DdpFigures", "DdpWatch"]

_NS_PER_MS = 1e6


@dataclass(frozen=True)
class DdpFigures:
    """DDP's communication per timed step.

    Attributes:
        modules: the DDP modules the script built.
        buckets: the buckets of their gradients.
        bucket_bytes: the bytes of those buckets, all-reduced by each syncing backward.
        reductions_per_step: the syncing backwards a step (outside ``no_sync``).
        bytes_per_step: the bytes all-reduced a step.
        compute_ms: the backward's compute, ms an iteration (DDP's logging data, over the sampled iterations).
        comm_ms: the backward's all-reduce, ms an iteration.
        overlap_ms: the part of the all-reduce that overlapped the compute, ms an iteration.
        samples: the iterations sampled.
    """

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
    """Watch every DDP module the script builds, for the block (see the module docstring)."""

    def __init__(self) -> None:
        self._modules: weakref.WeakSet[DistributedDataParallel] = weakref.WeakSet()
        self._saved: list[tuple[str, Callable[..., Any]]] = []
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

        self._saved = [("__init__", init), ("forward", forward)]
        DistributedDataParallel.__init__ = made  # type: ignore[method-assign,assignment]
        DistributedDataParallel.forward = forwarded  # type: ignore[method-assign,assignment]
        return self

    def __exit__(self, *exc_info: object) -> None:
        for name, original in self._saved:
            setattr(DistributedDataParallel, name, original)
        self._saved = []

    def start(self) -> None:
        """The timed steps begin: samples are kept from here."""
        self._at_step = self.reductions

    def sample(self) -> None:
        """A timed step ended: keep its syncing forwards and the iteration each module logged last."""
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

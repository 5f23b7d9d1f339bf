"""The script's DataLoaders, watched without changing them: the wait in ``next()``, the batches, the workers.

`DataLoader.__iter__` (where workers start) and `_BaseDataLoaderIter.__next__` (which every iterator kind inherits)
are wrapped for the run. Workers start, and the loader's own work runs, with no instrument on (`no_modes`): a worker
started by fork copies this process, mode stacks included (docs/doctor.md, "What it runs").
"""

from __future__ import annotations

import contextlib
import time
import weakref
from dataclasses import dataclass
from typing import Any

from torch.utils.data import DataLoader
from torch.utils.data.dataloader import _BaseDataLoaderIter, _MultiProcessingDataLoaderIter

from pitfalls.doctor.cuda_on_cpu import no_modes
from pitfalls.doctor.phases import Phases
from pitfalls.doctor.steps import StepCounter
from pitfalls.families.loader.workers import shut_down
from pitfalls.probes.sites import SourceLine, locate_dispatch, source_line

__all__ = ["LoaderStart", "LoaderWatch"]


@dataclass
class LoaderStart:
    """The first iterator's start, a one-off cost: its workers, the seconds ``iter(loader)`` took (the workers'
    start, with workers) and the seconds from ``iter(loader)`` (at ``began``) to its first batch."""

    iterator: int
    began: float
    workers: int
    start_s: float
    first_batch_s: float | None = None


class LoaderWatch:
    """Wrap every DataLoader's iteration for the block: tell ``counter`` of each batch asked for (it may raise to stop
    the run) and delivered, and ``phases`` of each batch with its wait; every iterator with workers is kept (weakly),
    so that their workers can be shut down however the script ended."""

    def __init__(self, counter: StepCounter, phases: Phases) -> None:
        self._counter = counter
        self._phases = phases
        self._iterators: weakref.WeakSet[_MultiProcessingDataLoaderIter] = weakref.WeakSet()
        self._pinning: weakref.WeakSet[_BaseDataLoaderIter] = weakref.WeakSet()
        self._saved: tuple[Any, Any] | None = None
        self.start: LoaderStart | None = None
        self.line: SourceLine | None = None

    def __enter__(self) -> LoaderWatch:
        watch = self
        original_iter, original_next = DataLoader.__iter__, _BaseDataLoaderIter.__next__
        self._saved = (original_iter, original_next)

        def __iter__(loader: DataLoader) -> Any:  # noqa: N807 (the method it stands in for)
            began = time.perf_counter()
            with no_modes():
                iterator = original_iter(loader)
            if isinstance(iterator, _MultiProcessingDataLoaderIter):
                watch._iterators.add(iterator)
            if isinstance(iterator, _BaseDataLoaderIter):
                if loader.pin_memory:
                    watch._pinning.add(iterator)
                if watch.start is None:
                    watch.start = LoaderStart(id(iterator), began, _workers(iterator), time.perf_counter() - began)
            return iterator

        def __next__(iterator: _BaseDataLoaderIter) -> Any:  # noqa: N807
            watch._counter.batch_asked()
            line = source_line(locate_dispatch()[0])  # the script's line that asks for the batch
            if watch.line is None:
                watch.line = line
            began = time.perf_counter()
            with no_modes() if watch._phases.instruments_on() else contextlib.nullcontext():
                batch = original_next(iterator)
            waited = time.perf_counter() - began
            start = watch.start
            if start is not None and start.first_batch_s is None and start.iterator == id(iterator):
                start.first_batch_s = time.perf_counter() - start.began
            watch._counter.batch_delivered()
            watch._phases.batch_arrived(waited, _workers(iterator), batch, iterator in watch._pinning, line)
            return batch

        DataLoader.__iter__ = __iter__  # type: ignore[method-assign]
        _BaseDataLoaderIter.__next__ = __next__  # type: ignore[method-assign,assignment]
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._saved is not None:
            DataLoader.__iter__, _BaseDataLoaderIter.__next__ = self._saved  # type: ignore[method-assign]
            self._saved = None

    def shut_down(self) -> None:
        """Shut down the workers of every iterator the script left behind (the loader family's shutdown: each
        worker joined or killed, and the threads feeding its queues joined)."""
        for iterator in list(self._iterators):
            shut_down(iterator)


def _workers(iterator: object) -> int:
    return int(getattr(iterator, "_num_workers", 0))

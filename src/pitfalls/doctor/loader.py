"""The script's DataLoaders, watched without changing them: the wait in ``next()``, the batches, the workers.

`DataLoader.__iter__` (where workers start) and `_BaseDataLoaderIter.__next__` (what ``for batch in loader``
calls; every iterator kind inherits it) are wrapped for the run and restored after it. Workers start, and the
loader's own work runs, with no instrument on (`modes.no_modes`): a worker started by fork copies this process as
it is, and a dataset's host code is not the training step's. Every iterator with workers is kept (weakly), so the
doctor can shut its workers down however the script ended.
"""

from __future__ import annotations

import contextlib
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch.utils.data import DataLoader
from torch.utils.data.dataloader import _BaseDataLoaderIter, _MultiProcessingDataLoaderIter

from pitfalls.doctor.modes import no_modes
from pitfalls.probes.sites import SourceLine, locate_dispatch, source_line

__all__ = ["LoaderStart", "LoaderWatch"]


@dataclass(frozen=True)
class LoaderStart:
    """The first iterator's start, a one-off cost.

    Attributes:
        workers: its workers.
        start_s: seconds ``iter(loader)`` took (the workers' start, with workers).
        first_batch_s: seconds from ``iter(loader)`` to its first batch.
    """

    workers: int
    start_s: float
    first_batch_s: float | None


def _caller_line() -> SourceLine | None:
    """The script's line that asked for the batch (the innermost frame outside torch and the doctor)."""
    return source_line(locate_dispatch()[0])


class LoaderWatch:
    """Wrap every DataLoader's iteration for the block.

    Args:
        asked: called when a batch is asked for, before it is fetched; it may raise to stop the run.
        arrived: called with the seconds waited in ``next()``, the loader's workers, the batch, and whether its
            loader asked for pinned memory (``pin_memory=True``, which pins nothing without an accelerator).
        quiet: says whether an instrument is on, so that the loader's own work must run without it.
        clock: seconds as a float.
    """

    def __init__(
        self,
        asked: Callable[[], None],
        arrived: Callable[[float, int, Any, bool], None],
        quiet: Callable[[], bool],
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._asked = asked
        self._arrived = arrived
        self._quiet = quiet
        self._clock = clock
        self._iterators: weakref.WeakSet[_MultiProcessingDataLoaderIter] = weakref.WeakSet()
        self._pinning: weakref.WeakSet[_BaseDataLoaderIter] = weakref.WeakSet()
        self._saved: tuple[Any, Any] | None = None
        self.start: LoaderStart | None = None
        self._first_start: tuple[int, float, float] | None = None
        self.line: SourceLine | None = None

    def __enter__(self) -> LoaderWatch:
        watch = self
        original_iter, original_next = DataLoader.__iter__, _BaseDataLoaderIter.__next__
        self._saved = (original_iter, original_next)

        def __iter__(loader: DataLoader) -> Any:  # noqa: N807 (the method it stands in for)
            began = watch._clock()
            with no_modes():
                iterator = original_iter(loader)
            if loader.pin_memory and isinstance(iterator, _BaseDataLoaderIter):
                watch._pinning.add(iterator)
            watch._iterator_started(iterator, began)
            return iterator

        def __next__(iterator: _BaseDataLoaderIter) -> Any:  # noqa: N807
            watch._asked()
            if watch.line is None:
                watch.line = _caller_line()
            began = watch._clock()
            guard = no_modes() if watch._quiet() else contextlib.nullcontext()
            with guard:
                batch = original_next(iterator)
            waited = watch._clock() - began
            watch._batch_arrived(iterator, waited, batch)
            return batch

        DataLoader.__iter__ = __iter__  # type: ignore[method-assign]
        _BaseDataLoaderIter.__next__ = __next__  # type: ignore[method-assign,assignment]
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._saved is not None:
            DataLoader.__iter__, _BaseDataLoaderIter.__next__ = self._saved  # type: ignore[method-assign]
            self._saved = None

    def _iterator_started(self, iterator: Any, began: float) -> None:
        if isinstance(iterator, _MultiProcessingDataLoaderIter):
            self._iterators.add(iterator)
        if self._first_start is None and isinstance(iterator, _BaseDataLoaderIter):
            self._first_start = (id(iterator), began, self._clock() - began)
            self.start = LoaderStart(_workers(iterator), self._first_start[2], None)

    def _batch_arrived(self, iterator: _BaseDataLoaderIter, waited: float, batch: Any) -> None:
        first = self._first_start
        if first is not None and first[0] == id(iterator) and self.start is not None \
                and self.start.first_batch_s is None:
            self.start = LoaderStart(self.start.workers, self.start.start_s, self._clock() - first[1])
        self._arrived(waited, _workers(iterator), batch, iterator in self._pinning)

    def shut_down(self) -> int:
        """Shut down the workers of every iterator the script left behind; returns how many iterators had any."""
        stopped = 0
        for iterator in list(self._iterators):
            if getattr(iterator, "_workers", None):
                iterator._shutdown_workers()
                stopped += 1
        return stopped


def _workers(iterator: object) -> int:
    return int(getattr(iterator, "_num_workers", 0))

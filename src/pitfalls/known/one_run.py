"""One planted run shared by the several rows that read figures of it, as a benchmark reads its figures of one run."""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["OneRun"]

T = TypeVar("T")


class OneRun(Generic[T]):
    """One measurement shared by several rows: each row reads it once; a row that reads again gets a new one.

    A row measured once more (a miss measured again, a row run alone) then reads a new run, never the one it
    missed on, while its sibling rows of one ``pitfalls calibrate`` still share the run they read.

    Args:
        measure: ``measure(*args)`` runs the planted workload once; one run is kept per ``args``.
    """

    def __init__(self, measure: Callable[..., T]) -> None:
        self.measure = measure
        self._runs: dict[tuple[Hashable, ...], tuple[T, set[str]]] = {}

    def take(self, row: str, *args: Hashable) -> T:
        """The current run of ``args`` for ``row``, measured afresh if there is none or ``row`` has read it."""
        run = self._runs.get(args)
        if run is None or row in run[1]:
            run = self._runs[args] = (self.measure(*args), set())
        run[1].add(row)
        return run[0]

    def reader(self, row: str) -> Callable[..., T]:
        """``take`` for one row: a callable of the measure's arguments."""
        return functools.partial(self.take, row)

"""The user's loader rebuilt with other options from the same dataset, its batches cycling without an epoch end,
and the pids of its workers."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from torch.utils.data import DataLoader, IterableDataset

from pitfalls.scan_loader.interrupts import ignore_in_child

__all__ = ["ChildInit", "CyclingBatches", "rebuild", "worker_pids"]

DEFAULT_PREFETCH = 2


class CyclingBatches:
    """A batch sampler that repeats the user's, epoch after epoch, so that a timed run never meets an epoch end."""

    def __init__(self, inner: Iterable[list[int]]) -> None:
        self.inner = inner

    def __iter__(self) -> Iterator[list[int]]:
        while True:
            yielded = False
            for indices in self.inner:
                yielded = True
                yield indices
            if not yielded:
                return

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]


class ChildInit:
    """``worker_init_fn`` of a rebuilt loader: the worker leaves Ctrl-C to the scan (`ignore_in_child`), then runs
    the user's own ``worker_init_fn``, if any."""

    def __init__(self, user: Callable[[int], None] | None) -> None:
        self.user = user

    def __call__(self, worker_id: int) -> None:
        ignore_in_child()
        if self.user is not None:
            self.user(worker_id)


def rebuild(loader: DataLoader[Any], *, workers: int, pin_memory: bool = False, persistent_workers: bool = False,
            cycle: bool = True) -> DataLoader[Any]:
    """A new DataLoader over the user's dataset, sampler, collate function and worker options (the user's untouched),
    with DataLoader's ``num_workers=workers``, ``pin_memory`` and ``persistent_workers`` (with workers only); with
    ``cycle``, the epochs repeat without end (a map-style dataset with a batch sampler only)."""
    options: dict[str, Any] = {"num_workers": workers, "pin_memory": pin_memory, "collate_fn": loader.collate_fn,
                               "timeout": loader.timeout, "generator": loader.generator}
    if workers:
        options.update(prefetch_factor=loader.prefetch_factor or DEFAULT_PREFETCH,
                       persistent_workers=persistent_workers, worker_init_fn=ChildInit(loader.worker_init_fn),
                       multiprocessing_context=loader.multiprocessing_context)
    if isinstance(loader.dataset, IterableDataset):
        options.update(batch_size=loader.batch_size, drop_last=loader.drop_last)
    elif loader.batch_sampler is not None:
        options["batch_sampler"] = CyclingBatches(loader.batch_sampler) if cycle else loader.batch_sampler
    else:
        options.update(batch_size=None, sampler=loader.sampler)
    return DataLoader(loader.dataset, **options)


def worker_pids(iterator: Iterator[Any], *, live: bool = True) -> list[int]:
    """The pids of a DataLoader iterator's workers (none without workers): the live ones, or with ``live=False``
    every one started."""
    return [int(w.pid) for w in getattr(iterator, "_workers", ()) if w.pid is not None and (not live or w.is_alive())]

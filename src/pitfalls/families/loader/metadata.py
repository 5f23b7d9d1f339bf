"""PyTorch issue 13246's case: per-item records a data set holds, and what forked workers copy of them in an epoch.

A data set usually carries one record per item: its path, its size, a small annotation dict. Held as a Python
list of objects, every record a worker reads has its reference counts written, and the garbage collector writes
the header of every container it visits: each page holding them is copied into the worker (copy-on-write), so
over an epoch each worker ends up with its own copy of most of the table, and the group holds it once per worker.
Held as a few numpy arrays (the paths in one byte buffer with offsets), the same reads write nothing of the table.

`epoch_memory` runs one full epoch of any data set through DataLoader with the loader family's worker machinery
(`WorkerBoard`, `WorkerInit`) and reads each worker's USS and PSS (psutil, from ``/proc/PID/smaps``): the growth
of its private memory from its start to the end of the epoch, and the group's totals. `metadata_memory` is that
figure for the records; the calibration plants a known copy through the same function.
"""

from __future__ import annotations

import multiprocessing
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import psutil
import torch
from torch.utils.data import DataLoader, Dataset

from pitfalls.families.loader.stores import packed
from pitfalls.families.loader.workers import (
    CyclingSampler,
    WorkerBoard,
    WorkerInit,
    forked_workers_only,
    settle_before_fork,
    shut_down,
    uss_without_batches,
)
from pitfalls.units import MIB

RECORD_FORMS = ("objects", "arrays")
# The sizes the asv benchmark sweeps, per grid: 100,000 records is a mid-sized detection set's annotations.
GRIDS = {
    "quick": {"num_workers": (2,), "items": (100_000,)},
    "full": {"num_workers": (1, 2, 4), "items": (100_000, 1_000_000)},
}
# How long the workers get, after the epoch's last batch, to finish the batches DataLoader asked ahead of it.
SETTLE_S = 0.5
# Seconds to wait for one batch.
TIMEOUT_S = 120.0


# --- the records ------------------------------------------------------------------------------------------------


def object_records(count: int, seed: int = 0) -> list[dict[str, Any]]:
    """``count`` per-item records as a Python list of dicts: path, size in bytes, annotation (label, box, crowd)."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(20_000, 400_000, count).tolist()
    labels = rng.integers(0, 80, count).tolist()
    boxes = rng.integers(0, 512, (count, 4)).tolist()
    crowd = (rng.random(count) < 0.05).tolist()
    return [{"path": f"train/{index // 1000:04d}/{index:08d}.jpg", "size": sizes[index],
             "annotation": {"label": labels[index], "box": boxes[index], "crowd": crowd[index]}}
            for index in range(count)]


class ObjectRecords:
    """The records as most data sets hold them: one dict per item, with its own strings, ints and lists."""

    def __init__(self, records: list[dict[str, Any]]) -> None:
        self.records = records

    def __len__(self) -> int:
        return len(self.records)

    @property
    def nbytes(self) -> int:
        """Bytes of every object of the table (``sys.getsizeof``, each object once; interned small ints free)."""
        seen: set[int] = set()

        def size(value: Any) -> int:
            if id(value) in seen:
                return 0
            seen.add(id(value))
            inner = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
            return sys.getsizeof(value) + sum(size(part) for part in inner)

        return size(self.records)

    def __getitem__(self, index: int) -> tuple[str, int, int, list[int]]:
        record = self.records[index]
        annotation = record["annotation"]
        return record["path"], record["size"], annotation["label"], annotation["box"]


class ArrayRecords:
    """The same records in a few numpy arrays: paths in one byte buffer with offsets, one array per field."""

    def __init__(self, records: list[dict[str, Any]]) -> None:
        self.offsets, self.paths = packed([record["path"].encode() for record in records])
        self.sizes = np.array([record["size"] for record in records], dtype=np.int64)
        self.labels = np.array([record["annotation"]["label"] for record in records], dtype=np.int64)
        self.boxes = np.array([record["annotation"]["box"] for record in records], dtype=np.int32).reshape(-1, 4)
        self.crowd = np.array([record["annotation"]["crowd"] for record in records], dtype=bool)

    def __len__(self) -> int:
        return len(self.sizes)

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays."""
        return sum(int(a.nbytes) for a in (self.offsets, self.paths, self.sizes, self.labels, self.boxes, self.crowd))

    def __getitem__(self, index: int) -> tuple[str, int, int, list[int]]:
        path = self.paths[self.offsets[index]:self.offsets[index + 1]].tobytes().decode()
        return path, int(self.sizes[index]), int(self.labels[index]), self.boxes[index].tolist()


def make_records(form: str, count: int, seed: int = 0) -> ObjectRecords | ArrayRecords:
    """The records in one of `RECORD_FORMS`."""
    if form not in RECORD_FORMS:
        raise ValueError(f"metadata={form!r} is not allowed; allowed: {', '.join(RECORD_FORMS)}")
    records = object_records(count, seed)
    return ObjectRecords(records) if form == "objects" else ArrayRecords(records)


class RecordItems(Dataset[Any]):
    """An item is what a loader reads of its record before it opens the file: path, size, label and box."""

    def __init__(self, records: ObjectRecords | ArrayRecords) -> None:
        self.records = records

    def __len__(self) -> int:
        return len(self.records)

    @property
    def nbytes(self) -> int:
        return self.records.nbytes

    def __getitem__(self, index: int) -> tuple[int, int, int, int]:
        path, size, label, box = self.records[index]
        return len(path), size, label, sum(box)


def collate_rows(items: list[tuple[int, ...]]) -> torch.Tensor:
    """A batch of small integer rows as one int64 tensor."""
    return torch.tensor(items, dtype=torch.int64)


# --- one epoch, measured ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EpochMemory:
    """Memory of a loader group at the end of one full epoch (bytes).

    Attributes:
        growth: per worker, its USS at the end of the epoch less its USS when it started (`WorkerBoard`).
        worker_uss: per worker, its USS at the end of the epoch (its batches in hand left out).
        worker_pss: per worker, its PSS at the end of the epoch.
        parent_uss: the main process's USS at the end of the epoch.
        parent_pss: the main process's PSS at the end of the epoch.
        items: items in the epoch (every one read once, by some worker).
        dataset_bytes: the bytes the data set says it holds (its ``nbytes``; 0 when it does not say).
    """

    growth: tuple[int, ...]
    worker_uss: tuple[int, ...]
    worker_pss: tuple[int, ...]
    parent_uss: int
    parent_pss: int
    items: int
    dataset_bytes: int

    @property
    def group_uss(self) -> int:
        """USS of the main process and every worker, summed: what the group holds that no one else shares."""
        return self.parent_uss + sum(self.worker_uss)

    @property
    def group_pss(self) -> int:
        """PSS of the main process and every worker, summed: each shared page counted once."""
        return self.parent_pss + sum(self.worker_pss)

    @property
    def mean_growth(self) -> float:
        """The workers' USS growth over the epoch, per worker."""
        return sum(self.growth) / len(self.growth)


def epoch_memory(dataset: Dataset[Any], *, workers: int, batch: int, collate: Callable[[list[Any]], Any],
                 start_method: str = "fork") -> EpochMemory:
    """Run one full epoch of ``dataset`` through DataLoader's workers and read the group's memory at its end.

    The sampler cycles (`CyclingSampler`), so the workers are still alive when the epoch's last batch arrives;
    they have read that epoch's items plus the few batches DataLoader asks ahead (``prefetch_factor`` per
    worker). Each worker's growth is measured from its start, by the same reading inside it (at start) and
    from the main process (at the end), so the batches it hands over are not counted.

    Args:
        dataset: any map-style data set.
        workers: DataLoader's num_workers, at least 1.
        batch: items per batch.
        collate: the collate function.
        start_method: how workers start; only "fork" shares the parent's pages.

    Raises:
        SkipCase: no workers, or workers that do not fork (they hold a pickled copy: nothing is copied on write).
    """
    forked_workers_only(workers, start_method)
    count = len(dataset)  # type: ignore[arg-type]
    context = multiprocessing.get_context(start_method)
    board = WorkerBoard(workers, context, measure_uss=True)
    loader = DataLoader(dataset, batch_size=batch, sampler=CyclingSampler(count, seed=0), num_workers=workers,
                        collate_fn=collate, drop_last=False, worker_init_fn=WorkerInit(board),
                        multiprocessing_context=context, timeout=TIMEOUT_S)
    settle_before_fork()
    iterator = iter(loader)
    try:
        for _ in range(-(-count // batch)):
            next(iterator)
        time.sleep(SETTLE_S)
        pids = [int(pid) for pid in board.pids]
        worker_uss = tuple(uss_without_batches(pid) for pid in pids)
        growth = tuple(uss - int(start) for uss, start in zip(worker_uss, board.uss_at_start, strict=True))
        worker_pss = tuple(psutil.Process(pid).memory_full_info().pss for pid in pids)
        parent = psutil.Process().memory_full_info()
        return EpochMemory(growth, worker_uss, worker_pss, parent.uss, parent.pss, count,
                           int(getattr(dataset, "nbytes", 0)))
    finally:
        shut_down(iterator)


def metadata_memory(form: str, *, workers: int, items: int = 100_000, batch: int = 500,
                    start_method: str = "fork") -> EpochMemory:
    """Issue 13246's figure: the loader group's memory after an epoch over ``items`` records held in ``form``.

    Args:
        form: "objects" (a list of dicts) or "arrays" (numpy).
        workers: num_workers.
        items: records in the table (an epoch reads each once).
        batch: items per batch.
        start_method: how workers start.
    """
    return epoch_memory(RecordItems(make_records(form, items)), workers=workers, batch=batch, collate=collate_rows,
                        start_method=start_method)


def records_memory(metadata: str, num_workers: int, items: int) -> EpochMemory:
    """`metadata_memory` by the benchmark's axes: the records' form, the workers and the items."""
    return metadata_memory(metadata, workers=num_workers, items=items)


def mib(values: Sequence[int] | int) -> float:
    """Bytes to MiB (a sequence: its sum)."""
    return (values if isinstance(values, int) else sum(values)) / MIB

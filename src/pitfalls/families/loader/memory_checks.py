"""Known answers for the loader's memory figures, planted through the loader's own `LoaderStep` and figure code.

- Group peak (`probes.peak_memory`'s reading, `memory.group_peak`): W workers that each allocate and touch N MiB of
  their own; the group's peak USS grows by W x N over the same run without the allocation. A sampler that sees the
  main process alone reads about 0.
- Copy-on-write per item read (`probes.copy_on_write_of`): every item a worker reads writes one byte in each of K
  pages of a buffer the main process holds, fresh pages for every read, so each read copies exactly K pages.
- The workers' growth over an epoch (issue 13246's figure, `metadata.epoch_memory`): each worker writes one byte in
  every page of an N MiB buffer of the main process once; its growth is N MiB more than without the buffer. From
  the same epochs, the group's USS at the epoch's end grows by (W + 1) x N (each worker's copy, and the main
  process's original, no longer shared with anyone), and its PSS by that plus S, a second buffer of S MiB the
  workers never write: shared by the W + 1 processes since the fork, counted once in PSS and in no one's USS.
- The table's bytes (the records' ``nbytes``, read by `metadata.epoch_memory` as the benchmark reads it): a table of
  per-item records whose annotation dicts reference one planted N MiB ``bytes`` object from two records reads N MiB
  more than the same table without it: each object once, however deep and however often referenced.

Each planted item is a tiny uint8 image and mask, delivered and trained on like the ``uint8`` rung's.
"""

from __future__ import annotations

import mmap
import statistics
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from pitfalls.families.loader import check_data, metadata
from pitfalls.families.loader.entry import NAME
from pitfalls.families.loader.metadata import EpochMemory
from pitfalls.families.loader.probes import COPIED_PER_ITEM, PEAK_PSS, PEAK_USS, copy_on_write_of, group_peak
from pitfalls.families.loader.steps import LoaderStep
from pitfalls.known.one_run import OneRun
from pitfalls.known.table import Check, Reading, own_instrument
from pitfalls.probes.group_memory import GroupMemory
from pitfalls.result import Unavailable
from pitfalls.units import MIB

PAGE = mmap.PAGESIZE
WORKERS = 2
# Large against the main process's own transients (a peak of the sum moved by up to 12 MiB between runs here).
HELD_MIB = 128
GROWTH_MIB = 48
# 256 KiB per item, 32 MiB over the window: a worker's own heap moves by a MiB or so between two readings.
PAGES_PER_ITEM = 64
COPY_ITEMS = 128

# Never written by the workers: large against the main process's own moves between two epochs (a MiB or two).
SHARED_MIB = 64
METADATA_PAIRS = 3

# The metadata benchmark's figures (the others are `probes.own_figures`' names).
METADATA_GROWTH = "metadata: worker growth over an epoch"
METADATA_GROUP_USS = "metadata: group USS at the epoch's end"
METADATA_GROUP_PSS = "metadata: group PSS at the epoch's end"
METADATA_TABLE = "metadata: the table's bytes"
# Large against nothing: both tables are the same but for the payload, so any size is exact; large enough that a
# walker that missed it or counted it twice reads far off.
PAYLOAD_MIB = 64
TABLE_RECORDS = 2_000


class HeldPerWorker(check_data.Items):
    """Each worker, at its first item, allocates ``planted_mib`` MiB of its own and touches every page of it."""

    def __init__(self, items: int, planted_mib: int) -> None:
        super().__init__(items)
        self.planted = planted_mib * MIB
        self.held: np.ndarray | None = None

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.held is None and self.planted:
            self.held = np.ones(self.planted, dtype=np.uint8)
        return super().__getitem__(index)


class CopiedPerRead(check_data.Items):
    """Each read writes one byte in each of the next K pages of a buffer the main process holds: K fresh pages
    per read, whichever item it is, so a worker that reads an item again still copies K pages."""

    def __init__(self, items: int, pages_per_read: int, reads: int) -> None:
        super().__init__(items)
        self.pages = pages_per_read
        self.buffer = np.ones(reads * pages_per_read * PAGE, dtype=np.uint8)
        self.reads = 0

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        first = self.reads * self.pages * PAGE
        self.buffer[first:first + self.pages * PAGE:PAGE] += 1
        self.reads += 1
        return super().__getitem__(index)


class WrittenOnce(Dataset[Any]):
    """Each worker, at its first item, writes one byte in every page of a buffer the main process holds; a second
    buffer of ``shared_mib``, also the main process's, no one writes after the fork."""

    def __init__(self, planted_mib: int, items: int = 400, shared_mib: int = 0) -> None:
        self.buffer = np.ones(planted_mib * MIB, dtype=np.uint8)
        self.shared = np.ones(shared_mib * MIB, dtype=np.uint8)
        self.items = items
        self.written = False

    def __len__(self) -> int:
        return self.items

    def __getitem__(self, index: int) -> tuple[int]:
        if not self.written:
            self.buffer[::PAGE] += 1
            self.written = True
        return (index,)


def planted_step(dataset: Dataset[Any], workers: int, *, measure_uss: bool = False) -> LoaderStep:
    """A CPU `LoaderStep` of the ``uint8`` rung, batches of 4, whose data set is ``dataset`` (a planted one)."""
    return check_data.step(dataset, measure_uss=measure_uss, image_size=check_data.Items.size, num_workers=workers,
                           batch=4)


def held_peak(planted_mib: int) -> GroupMemory:
    """The group peak of a planted loader whose workers hold ``planted_mib`` MiB each, over 16 batches after 8.

    The first batches are left out of the window on both sides: before the workers fork, the main process's
    pages are all its own (USS), and afterwards they are shared, so a window that starts earlier compares the
    planted run's peak with the bare run's start-up.
    """
    with planted_step(HeldPerWorker(64, planted_mib), WORKERS) as step:
        for _ in range(8):
            step()
        return group_peak(step, batches=16)


def measure_group_peak(_device: str) -> Reading:
    """W workers each hold N MiB: the group's peak USS grows by W x N over the same run without them.

    A first bare run is thrown away: the first loader of a process also pays one-time allocations of its own
    (seen here: 13 MiB more in whichever run came first).
    """
    held_peak(0)
    held, bare = held_peak(HELD_MIB), held_peak(0)
    return Reading(WORKERS * HELD_MIB, (held.peak_uss - bare.peak_uss) / MIB,
                   f"{WORKERS} workers x {HELD_MIB} MiB: peak USS {held.peak_uss / MIB:.0f} against "
                   f"{bare.peak_uss / MIB:.0f} MiB ({held.samples} and {bare.samples} samples)")


def measure_copied_per_item(_device: str) -> Reading:
    """Each read copies K pages: the copy-on-write figure reads K x 4 KiB per item."""
    with planted_step(CopiedPerRead(COPY_ITEMS, PAGES_PER_ITEM, reads=3 * COPY_ITEMS), WORKERS,
                      measure_uss=True) as step:
        growth = copy_on_write_of(step, epochs=1)
    per_item = growth.per_item
    measured = per_item if isinstance(per_item, Unavailable) else per_item / 1024
    return Reading(PAGES_PER_ITEM * PAGE / 1024, measured,
                   f"{growth.items_read} items read by {len(growth.window)} workers after their first batch")


def planted_epochs() -> list[tuple[EpochMemory, EpochMemory]]:
    """Pairs of epochs through `metadata.epoch_memory` (issue 13246's figures): `WrittenOnce` with ``GROWTH_MIB``
    written and ``SHARED_MIB`` left shared, then the same with neither buffer."""

    def epoch(planted_mib: int, shared_mib: int) -> EpochMemory:
        return metadata.epoch_memory(WrittenOnce(planted_mib, shared_mib=shared_mib), workers=WORKERS, batch=50,
                                     collate=metadata.collate_rows)

    return [(epoch(GROWTH_MIB, SHARED_MIB), epoch(0, 0)) for _ in range(METADATA_PAIRS)]


# The three metadata rows read one set of epochs, as the benchmark reads its three figures from one epoch.
EPOCHS: OneRun[list[tuple[EpochMemory, EpochMemory]]] = OneRun(planted_epochs)


def metadata_reading(read: Callable[[EpochMemory], float], planted_mib: float,
                     epochs: Callable[[], list[tuple[EpochMemory, EpochMemory]]]) -> Reading:
    """How much more ``read`` (bytes) gives with the buffers than without, over ``epochs`` (a row's `EPOCHS`
    reader: the epochs the other rows read): the median of the pairs, in MiB."""
    grown = [(read(with_buffers) - read(bare)) / MIB for with_buffers, bare in epochs()]
    return Reading(planted_mib, statistics.median(grown),
                   f"{WORKERS} workers, epochs of 400 items; median of {len(grown)} pairs "
                   f"({', '.join(f'{g:.1f}' for g in grown)})")


def _metadata_on(read: Callable[[EpochMemory], float], planted_mib: float, row: str, _device: str) -> Reading:
    """A metadata row's reading (see the module) of the epochs its sibling rows read."""
    return metadata_reading(read, planted_mib, EPOCHS.reader(row))


def planted_table_bytes(payload_mib: int) -> int:
    """The table bytes `metadata.epoch_memory` reads (one worker, one epoch) of `metadata.object_records`, the first
    two of whose annotation dicts hold one ``payload_mib`` MiB ``bytes`` object (none when 0)."""
    records = metadata.object_records(TABLE_RECORDS)
    if payload_mib:
        payload = bytes(payload_mib * MIB)
        for record in records[:2]:
            record["annotation"]["payload"] = payload
    table = metadata.RecordItems(metadata.ObjectRecords(records))
    return metadata.epoch_memory(table, workers=1, batch=500, collate=metadata.collate_rows).dataset_bytes


def measure_metadata_table(_device: str) -> Reading:
    """A planted N MiB object, referenced by two records' annotations: the table reads N MiB more."""
    with_payload, bare = planted_table_bytes(PAYLOAD_MIB), planted_table_bytes(0)
    return Reading(PAYLOAD_MIB, (with_payload - bare) / MIB,
                   f"{TABLE_RECORDS:,} records, {bare / MIB:.2f} MiB without the payload; one object, two references")


CHECKS = (
    Check(f"loader: group peak, {WORKERS} workers x {HELD_MIB} MiB",
          (own_instrument(NAME, PEAK_USS), own_instrument(NAME, PEAK_PSS)), "MiB", 0.05, measure_group_peak,
          family=NAME,
          why="the planted memory is exact; the main process's transients moved the peak by up to 12 MiB here"),
    check_data.row(f"loader: copy-on-write, {PAGES_PER_ITEM} pages per item", COPIED_PER_ITEM, "KiB/item", 0.15,
                measure_copied_per_item,
                "a worker's own heap moves by a MiB or so between its readings: it read 0.9-2.2 % high here"),
    check_data.row(f"loader: metadata growth, {GROWTH_MIB} MiB per worker", METADATA_GROWTH, "MiB", 0.05,
                partial(_metadata_on, lambda e: e.mean_growth, GROWTH_MIB, "growth"),
                "the planted copy is exact and the rest of the epoch is the same on both sides"),
    # W copies of the written buffer, and the main process's original.
    check_data.row(f"loader: metadata group USS, {WORKERS} workers x {GROWTH_MIB} MiB written", METADATA_GROUP_USS,
                "MiB", 0.05, partial(_metadata_on, lambda e: e.group_uss, (WORKERS + 1) * GROWTH_MIB, "group USS"),
                "read 143.9-146.3 for 144 here: the main process's own moves between epochs, a MiB or two"),
    # As the USS, plus the buffer no one wrote, once.
    check_data.row(f"loader: metadata group PSS, {SHARED_MIB} MiB shared", METADATA_GROUP_PSS, "MiB", 0.05,
                partial(_metadata_on, lambda e: e.group_pss, (WORKERS + 1) * GROWTH_MIB + SHARED_MIB, "group PSS"),
                "read 208.0-209.8 for 208 here; a PSS counting a shared page per sharer would read 336"),
    check_data.row(f"loader: metadata table, {PAYLOAD_MIB} MiB planted in two records", METADATA_TABLE, "MiB", 0.01,
                measure_metadata_table, "the same table on both sides: only the planted bytes object's 33-byte "
                "header is over"),
)

"""Issue 13246's case: per-item records as Python objects against numpy arrays, and the workers' copy of them."""

from __future__ import annotations

import pytest

from pitfalls.families.loader import metadata
from pitfalls.families.loader.memory_checks import WrittenOnce
from pitfalls.family import SkipCase

# Timing and memory figures read against planted values: with the machine to themselves.
pytestmark = pytest.mark.serial

MIB = 2**20


def test_both_forms_give_the_same_items() -> None:
    objects = metadata.RecordItems(metadata.make_records("objects", 2_000, seed=3))
    arrays = metadata.RecordItems(metadata.make_records("arrays", 2_000, seed=3))
    assert len(objects) == len(arrays) == 2_000
    assert [objects[i] for i in range(0, 2_000, 7)] == [arrays[i] for i in range(0, 2_000, 7)]
    assert metadata.make_records("objects", 10)[4][0] == "train/0000/00000004.jpg"
    with pytest.raises(ValueError, match="allowed: objects, arrays"):
        metadata.make_records("dicts", 10)


def test_the_object_table_is_many_times_the_arrays() -> None:
    objects = metadata.make_records("objects", 10_000).nbytes
    arrays = metadata.make_records("arrays", 10_000).nbytes
    # Arrays: 8 + 8 + 16 + 1 bytes of fields plus a 23-byte path and its 8-byte offset per record.
    assert arrays == pytest.approx(10_000 * (8 + 8 + 16 + 1 + 23 + 8), abs=16)
    assert objects > 5 * arrays


def test_no_workers_or_no_fork_is_a_reason() -> None:
    with pytest.raises(SkipCase, match="num_workers=0"):
        metadata.metadata_memory("objects", workers=0, items=1_000)
    with pytest.raises(SkipCase, match="pickled copy"):
        metadata.metadata_memory("objects", workers=1, items=1_000, start_method="spawn")


def test_workers_copy_the_object_table_and_not_the_arrays() -> None:
    items = 40_000
    table = metadata.make_records("objects", items).nbytes
    objects = metadata.metadata_memory("objects", workers=2, items=items, batch=500)
    arrays = metadata.metadata_memory("arrays", workers=2, items=items, batch=500)
    assert len(objects.growth) == len(arrays.growth) == 2 and objects.items == items
    # Each worker copies most of the pages of the objects it or the garbage collector touched.
    assert min(objects.growth) > 0.4 * table
    # The arrays' growth is the worker's own (its batches, its heap: 17 MiB here at load 5), the same on both
    # sides; what the objects add on top of it is most of the table.
    assert min(objects.growth) - max(arrays.growth) > 0.4 * table
    assert objects.group_uss == objects.parent_uss + sum(objects.worker_uss)
    assert objects.group_pss == objects.parent_pss + sum(objects.worker_pss)
    assert objects.group_uss - arrays.group_uss > 0.8 * table


def test_epoch_memory_reads_a_planted_copy_per_worker() -> None:
    def growth(planted: int) -> float:
        run = metadata.epoch_memory(WrittenOnce(planted, 400), workers=2, batch=50, collate=metadata.collate_rows)
        return run.mean_growth

    planted = growth(48) - growth(0)
    assert planted == pytest.approx(48 * MIB, rel=0.05)

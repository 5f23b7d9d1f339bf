"""The cold-disk probe: dropping a file from the page cache, seen through mincore."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import pytest

from pitfalls.probes import pagecache


def written(path: Path, size: int) -> Path:
    path.write_bytes(os.urandom(size))
    return path


def test_resident_pages_counts_every_page_of_a_file_just_read(tmp_path: Path) -> None:
    path = written(tmp_path / "f", 5 * mmap.PAGESIZE + 1)
    path.read_bytes()
    assert pagecache.resident_pages(path) == (6, 6)


def test_drop_evicts_every_page_after_write_back(tmp_path: Path) -> None:
    path = written(tmp_path / "f", 64 * mmap.PAGESIZE)
    pagecache.settle([path])
    path.read_bytes()
    pagecache.drop(path)
    assert pagecache.resident_pages(path) == (0, 64)
    assert pagecache.read_cold(path) == path.read_bytes()
    assert pagecache.resident_pages(path)[0] == 64  # the read brought them back


def test_a_cold_read_is_possible_here_and_an_empty_file_has_no_pages(tmp_path: Path) -> None:
    assert pagecache.cold_unavailable_reason(written(tmp_path / "f", 3 * mmap.PAGESIZE)) is None
    (tmp_path / "empty").write_bytes(b"")
    assert pagecache.resident_pages(tmp_path / "empty") == (0, 0)


def test_a_missing_file_is_a_reason_not_a_crash(tmp_path: Path) -> None:
    reason = pagecache.cold_unavailable_reason(tmp_path / "missing")
    assert reason is not None and "missing" in reason
    with pytest.raises(OSError):
        pagecache.resident_pages(tmp_path / "missing")


def test_a_drop_that_does_nothing_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The check must catch a drop that leaves the pages where they are (a file system that ignores the advice).
    monkeypatch.setattr(pagecache, "drop", lambda path: None)
    reason = pagecache.cold_unavailable_reason(written(tmp_path / "f", 4 * mmap.PAGESIZE))
    assert reason is not None and "left 4 of 4 pages" in reason
    cost = pagecache.cold_read_cost([tmp_path / "f"], rounds=1)
    assert cost.left_resident == 4


def test_cold_read_cost_reads_every_file_and_drops_them_all(tmp_path: Path) -> None:
    paths = [written(tmp_path / f"{i}", 3 * mmap.PAGESIZE) for i in range(20)]
    cost = pagecache.cold_read_cost(paths, rounds=3)
    assert (cost.files, cost.nbytes, cost.rounds, cost.left_resident) == (20, 20 * 3 * mmap.PAGESIZE, 3, 0)
    assert cost.cold_s > 0 and cost.warm_s > 0
    with pytest.raises(ValueError, match="needs files"):
        pagecache.cold_read_cost([], rounds=3)

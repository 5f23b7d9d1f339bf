"""A cold disk without root: drop a file's pages from the page cache before it is read, and check that they left.

``posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED)`` asks the kernel to evict a file's clean cached pages; any user
who can open the file may ask (``echo 3 > /proc/sys/vm/drop_caches`` needs root and drops everything). Dirty pages
are not evicted, so a file written and not yet flushed stays cached: `settle` writes a data set's files back once,
before its first cold read, and `resident_pages` says what stayed.

Whether the pages left is read with ``mincore(2)`` on a read-only shared mapping of the file, through ctypes: it
fills one byte per page whose low bit says "in the page cache", for any file the caller can map, without root
(``/proc/PID/pagemap`` hides frame numbers from unprivileged readers, and ``cachestat(2)`` needs Linux 6.5).

A cold read on a virtual machine may still be served by the host's own cache of the virtual disk: cold here means
"not in this kernel's page cache", and the figures built on it say what the read then cost, not where it came from.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ColdRead", "cold_read_cost", "cold_unavailable_reason", "drop", "read_cold", "resident_pages", "settle"]

_MAP_FAILED = ctypes.c_void_p(-1).value


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                          ctypes.c_long]
    libc.mincore.restype = ctypes.c_int
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    libc.munmap.restype = ctypes.c_int
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return libc


def drop(path: str | os.PathLike[str]) -> None:
    """Evict ``path``'s clean pages from the page cache (``POSIX_FADV_DONTNEED``); no root needed.

    Args:
        path: the file.

    Raises:
        OSError: the file cannot be opened, or the kernel refuses the advice.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def settle(paths: list[Path]) -> None:
    """Write back any dirty page of ``paths`` (``fdatasync``), so that `drop` can evict them all.

    A data set generated moments ago is still dirty in the page cache; ``POSIX_FADV_DONTNEED`` starts its
    write-back but evicts only the pages already clean.
    """
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
        finally:
            os.close(fd)


def resident_pages(path: str | os.PathLike[str]) -> tuple[int, int]:
    """How many of ``path``'s pages are in the page cache, by ``mincore(2)`` on a read-only mapping of it.

    Args:
        path: the file.

    Returns:
        (pages in the page cache, pages of the file); (0, 0) for an empty file.

    Raises:
        OSError: the file cannot be opened or mapped, or mincore fails (the errno says why).
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return 0, 0
        libc = _libc()
        address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if address in (None, _MAP_FAILED):
            error = ctypes.get_errno()
            raise OSError(error, f"mmap of {path}: {os.strerror(error)}")
        try:
            pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
            vector = (ctypes.c_ubyte * pages)()
            if libc.mincore(address, size, vector) != 0:
                error = ctypes.get_errno()
                raise OSError(error, f"mincore of {path}: {os.strerror(error)}")
            return sum(byte & 1 for byte in vector), pages
        finally:
            libc.munmap(address, size)
    finally:
        os.close(fd)


def read_cold(path: str | os.PathLike[str]) -> bytes:
    """Drop ``path`` from the page cache, then read it: what a loader reading from disk pays."""
    drop(path)
    return Path(path).read_bytes()


def cold_unavailable_reason(path: str | os.PathLike[str]) -> str | None:
    """Why a cold read of ``path`` cannot be made here, or None when dropping its pages works.

    Writes the file back (`settle`), reads it (so its pages are cached), drops it, and checks with
    `resident_pages` that no page stayed.
    """
    try:
        settle([Path(path)])
        Path(path).read_bytes()
        drop(path)
        left, pages = resident_pages(path)
    except OSError as error:
        return f"the page cache cannot be dropped or read for {path}: {error}"
    if left:
        return (f"posix_fadvise(POSIX_FADV_DONTNEED) left {left} of {pages} pages of {path} in the page cache "
                "(dirty pages, or a file system that ignores the advice): a cold read cannot be made here")
    return None


@dataclass(frozen=True)
class ColdRead:
    """What reading a set of files costs cold (just dropped from the page cache) and warm (cached).

    Attributes:
        cold_s: seconds to read every file once, all dropped from the page cache before the pass (the median
            round; the drops are not timed).
        warm_s: seconds to read every file once from the page cache (the median round).
        files: the files read per round.
        nbytes: their bytes.
        rounds: rounds of (cold, warm), interleaved so that drift on a shared machine affects both alike.
        left_resident: pages still cached right after a drop, over every file and round (0 when every drop
            worked).
    """

    cold_s: float
    warm_s: float
    files: int
    nbytes: int
    rounds: int
    left_resident: int

    @property
    def ratio(self) -> float:
        """Cold time over warm time."""
        return self.cold_s / self.warm_s


def cold_read_cost(paths: list[Path], rounds: int = 5) -> ColdRead:
    """Time reading ``paths`` cold, then warm, ``rounds`` times interleaved.

    Args:
        paths: the files (a data set's).
        rounds: rounds of one cold and one warm pass.

    Returns:
        The medians, the sizes and how many pages a drop failed to evict.
    """
    if not paths or rounds < 1:
        raise ValueError(f"cold_read_cost needs files and rounds >= 1; got {len(paths)} files, rounds={rounds}")
    settle(paths)
    cold, warm, left, nbytes = [], [], 0, 0
    for _ in range(rounds):
        for path in paths:
            drop(path)
            left += resident_pages(path)[0]
        started = time.perf_counter()
        nbytes = sum(len(Path(path).read_bytes()) for path in paths)
        cold.append(time.perf_counter() - started)
        started = time.perf_counter()
        for path in paths:
            Path(path).read_bytes()
        warm.append(time.perf_counter() - started)
    return ColdRead(statistics.median(cold), statistics.median(warm), len(paths), nbytes, rounds, left)

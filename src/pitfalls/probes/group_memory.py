"""Memory of a process group: a root process and all its descendants, sampled in a background thread.

A DataLoader with workers, or a launcher with ranks, is one program spread over several processes; the memory it
costs is the group's, not the parent's. RSS counts a page shared by W processes W times; USS (pages only this
process maps) never counts it; PSS charges each sharer 1/n of it, so the sum of PSS over the group counts each
shared page once. The sampler reads all three (psutil's ``memory_full_info``, from ``/proc/PID/smaps_rollup``)
for every member every ``interval_s``, and keeps per-process peaks and the group's peak of each sum.

Shared-memory segments (batches in flight between workers and the parent) are counted from what an unprivileged
process can read: every member's ``/proc/PID/fd`` links and ``/proc/PID/maps`` lines that point into
``/dev/shm``. torch's default ``file_descriptor`` sharing strategy unlinks its segments at once, so they are found
through those links and maps ("(deleted)"), never by listing ``/dev/shm``; the ``file_system`` strategy and
``multiprocessing.shared_memory`` leave named files, which the same links find. Segments are told apart by inode
and counted once, whatever the number of processes that map them.

The cgroup's own peak (``memory.peak`` on cgroup v2, ``memory.max_usage_in_bytes`` on v1) is read at the start
and the end where readable. It is the whole cgroup's (every process in the container, since the cgroup was made),
so it is a ceiling, not the group's figure: the result names the file it read.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import psutil

from pitfalls.result import Unavailable

__all__ = [
    "CgroupPeak",
    "GroupMemory",
    "GroupMemorySampler",
    "MemberSample",
    "cgroup_peak",
    "group_members",
    "members_named",
    "shm_segments",
    "wait_for_samples",
]

SHM_DIR = "/dev/shm/"
# POSIX named semaphores (multiprocessing's locks and events) live in /dev/shm as sem.*: 32 bytes of state in a
# page each, not data in flight.
SEMAPHORE_PREFIX = "/dev/shm/sem."


@dataclass(frozen=True)
class MemberSample:
    """One process's memory, bytes: at one sample, or its peaks over a window (each field's own).

    Attributes:
        pid: the process id.
        name: the process name.
        rss: resident set size.
        uss: unique set size (pages no other process maps).
        pss: proportional set size (shared pages divided among their sharers).
    """

    pid: int
    name: str
    rss: int
    uss: int
    pss: int


@dataclass(frozen=True)
class CgroupPeak:
    """A cgroup's peak memory read at the start and the end of the window.

    Attributes:
        path: the file read (``.../memory.peak`` or ``.../memory.max_usage_in_bytes``).
        start: its value when the window opened, bytes.
        end: its value when the window closed, bytes; above ``start`` only if the window set a new peak.
    """

    path: str
    start: int
    end: int


@dataclass(frozen=True)
class GroupMemory:
    """What the sampler saw: per-process peaks and the group's peaks of the sums, bytes.

    Attributes:
        processes: each process seen (root and descendants, alive at some sample), with its own peaks.
        peak_rss: the group's largest sum of RSS at one sample (counts shared pages once per sharer).
        peak_uss: the group's largest sum of USS at one sample (counts no shared page).
        peak_pss: the group's largest sum of PSS at one sample (counts each shared page once).
        peak_shm: the largest total size of distinct /dev/shm segments the group held at one sample.
        baseline_rss: the sum of RSS at the first sample (for growth over the window).
        baseline_uss: the sum of USS at the first sample.
        baseline_pss: the sum of PSS at the first sample.
        baseline_shm: the /dev/shm bytes at the first sample.
        peak_processes: the most processes alive at one sample.
        samples: how many samples were taken.
        interval_s: the sampling period asked for.
        cgroup: the cgroup's peak, or `Unavailable` with the reason.
    """

    processes: tuple[MemberSample, ...]
    peak_rss: int
    peak_uss: int
    peak_pss: int
    peak_shm: int
    baseline_rss: int
    baseline_uss: int
    baseline_pss: int
    baseline_shm: int
    peak_processes: int
    samples: int
    interval_s: float
    cgroup: CgroupPeak | Unavailable


def _member_sample(proc: psutil.Process) -> MemberSample | None:
    """One process's memory, or None when it ended (or became unreadable) before it was read."""
    try:
        with proc.oneshot():
            info = proc.memory_full_info()
            name = proc.name()
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return None
    return MemberSample(pid=proc.pid, name=name, rss=info.rss, uss=info.uss, pss=getattr(info, "pss", info.uss))


def group_members(root_pid: int) -> list[MemberSample]:
    """Sample the root process and every descendant alive now.

    Args:
        root_pid: the group's root process.

    Returns:
        One `MemberSample` per process that could be read (a process that ends meanwhile is left out).
    """
    try:
        root = psutil.Process(root_pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []
    return [s for s in (_member_sample(p) for p in procs) if s is not None]


def members_named(pids: Callable[[], Iterable[int]]) -> Callable[[int], list[MemberSample]]:
    """The process table of a group whose members are known: the root, the processes ``pids()`` names at each
    sample, and their descendants. Other children of the root (a multiprocessing resource tracker, a compile
    worker pool, a process an earlier piece of code left running) are not in the group.

    Args:
        pids: the members besides the root, read again at every sample (workers come and go).

    Returns:
        ``members(root_pid)`` for `GroupMemorySampler`.
    """

    def members(root_pid: int) -> list[MemberSample]:
        procs: dict[int, psutil.Process] = {}
        for pid in (root_pid, *pids()):
            try:
                proc = psutil.Process(pid)
                family = [proc] if pid == root_pid else [proc, *proc.children(recursive=True)]
            except psutil.NoSuchProcess:
                continue
            procs.update((p.pid, p) for p in family)
        return [s for s in (_member_sample(p) for p in procs.values()) if s is not None]

    return members


def _shm_from_fds(pid: int, found: dict[int, int]) -> None:
    fd_dir = f"/proc/{pid}/fd"
    try:
        entries = list(os.scandir(fd_dir))
    except OSError:  # the process ended or is not ours: nothing of it to count
        return
    for entry in entries:
        try:
            target = os.readlink(entry.path)
            if not target.startswith(SHM_DIR) or target.startswith(SEMAPHORE_PREFIX):
                continue
            st = os.stat(entry.path)  # follows the link to the (possibly unlinked) segment itself
        except OSError:
            continue
        found[st.st_ino] = max(found.get(st.st_ino, 0), st.st_size)


def _shm_from_maps(pid: int, found: dict[int, int]) -> None:
    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as fh:
            lines = fh.readlines()
    except OSError:
        return
    for line in lines:
        parts = line.split(maxsplit=5)
        if len(parts) < 6 or not parts[5].startswith(SHM_DIR) or parts[5].startswith(SEMAPHORE_PREFIX):
            continue
        start, end = (int(x, 16) for x in parts[0].split("-"))
        inode = int(parts[4])
        # A segment mapped in pieces adds up per process; across processes the largest view is kept.
        found[inode] = max(found.get(inode, 0), end - start)


def shm_segments(pids: Iterable[int]) -> dict[int, int]:
    """Distinct /dev/shm segments the processes hold open or mapped, by inode (named semaphores left out).

    Args:
        pids: the processes to look in.

    Returns:
        ``{inode: size in bytes}``; a segment held by several processes appears once.
    """
    found: dict[int, int] = {}
    for pid in pids:
        _shm_from_fds(pid, found)
        _shm_from_maps(pid, found)
    return found


def _cgroup_files() -> list[Path]:
    """Candidate files for this process's cgroup memory peak, most specific first."""
    files: list[Path] = []
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return files
    for line in lines:
        hid, controllers, path = line.split(":", 2)
        rel = path.lstrip("/")
        if hid == "0" and controllers == "":
            for base in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
                files += [base / rel / "memory.peak", base / "memory.peak"]
        elif "memory" in controllers.split(","):
            base = Path("/sys/fs/cgroup/memory")
            files += [base / rel / "memory.max_usage_in_bytes", base / "memory.max_usage_in_bytes"]
    return files


def cgroup_peak() -> tuple[str, int] | Unavailable:
    """This process's cgroup memory peak, bytes, with the file it came from.

    Returns:
        ``(path, bytes)`` from the first readable candidate (v2 ``memory.peak``, then v1
        ``memory.max_usage_in_bytes``), or `Unavailable` naming what was tried.
    """
    tried = _cgroup_files()
    for path in tried:
        try:
            return str(path), int(path.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return Unavailable("no readable cgroup memory peak (tried " + (", ".join(map(str, tried)) or "none") + ")")


class GroupMemorySampler:
    """Sample a process group's memory every ``interval_s`` in a background thread, as a context manager.

    Use ``with GroupMemorySampler() as s: ...`` then read ``s.result``. One sample is taken on entry (the
    baseline) and one on exit, besides the periodic ones.

    Args:
        root_pid: the group's root; the calling process by default.
        interval_s: seconds between samples (10-20 ms keeps up with a worker's batch; > 0).
        members: ``members(root_pid) -> list[MemberSample]``, the process table (`group_members`; a fake in tests).
        shm: ``shm(pids) -> {inode: bytes}``, the shared segments (`shm_segments`).
        cgroup: ``cgroup() -> (path, bytes) | Unavailable`` (`cgroup_peak`).
    """

    def __init__(
        self,
        root_pid: int | None = None,
        *,
        interval_s: float = 0.015,
        members: Callable[[int], list[MemberSample]] = group_members,
        shm: Callable[[Iterable[int]], dict[int, int]] = shm_segments,
        cgroup: Callable[[], tuple[str, int] | Unavailable] = cgroup_peak,
    ) -> None:
        if isinstance(interval_s, bool) or not isinstance(interval_s, (int, float)) or interval_s <= 0:
            raise ValueError(f"interval_s must be a number of seconds > 0, got {interval_s!r}")
        self.root_pid = os.getpid() if root_pid is None else root_pid
        self.interval_s = float(interval_s)
        self._members, self._shm, self._cgroup = members, shm, cgroup
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._peaks: dict[int, MemberSample] = {}
        self._sums = [0, 0, 0, 0]  # peak rss, uss, pss, shm
        self._baseline: tuple[int, int, int, int] | None = None
        self._most = 0
        self._samples = 0
        self._cgroup_start: tuple[str, int] | Unavailable = Unavailable("not started")
        self._result: GroupMemory | None = None

    @property
    def samples(self) -> int:
        """Samples taken so far (readable while the window is open)."""
        with self._lock:
            return self._samples

    def sample(self) -> None:
        """Take one sample now and fold it into the peaks."""
        members = self._members(self.root_pid)
        segments = self._shm([m.pid for m in members])
        sums = (sum(m.rss for m in members), sum(m.uss for m in members), sum(m.pss for m in members),
                sum(segments.values()))
        with self._lock:
            for m in members:
                old = self._peaks.get(m.pid)
                self._peaks[m.pid] = m if old is None else MemberSample(
                    m.pid, m.name, max(old.rss, m.rss), max(old.uss, m.uss), max(old.pss, m.pss))
            self._sums = [max(a, b) for a, b in zip(self._sums, sums, strict=True)]
            if self._baseline is None:
                self._baseline = sums
            self._most = max(self._most, len(members))
            self._samples += 1

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def __enter__(self) -> GroupMemorySampler:
        self._cgroup_start = self._cgroup()
        self.sample()
        self._thread = threading.Thread(target=self._run, name="group-memory", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()
        self._result = self._finish()

    def _finish(self) -> GroupMemory:
        start, end = self._cgroup_start, self._cgroup()
        cgroup: CgroupPeak | Unavailable
        if isinstance(start, Unavailable):
            cgroup = start
        elif isinstance(end, Unavailable):
            cgroup = end
        else:
            cgroup = CgroupPeak(path=start[0], start=start[1], end=end[1])
        base = self._baseline or (0, 0, 0, 0)
        return GroupMemory(
            processes=tuple(self._peaks.values()),
            peak_rss=self._sums[0], peak_uss=self._sums[1], peak_pss=self._sums[2], peak_shm=self._sums[3],
            baseline_rss=base[0], baseline_uss=base[1], baseline_pss=base[2], baseline_shm=base[3],
            peak_processes=self._most, samples=self._samples, interval_s=self.interval_s, cgroup=cgroup,
        )

    @property
    def result(self) -> GroupMemory:
        """The figures, once the ``with`` block has closed."""
        if self._result is None:
            raise RuntimeError("the group memory window is still open (read result after the with block)")
        return self._result


def wait_for_samples(sampler: GroupMemorySampler, count: int, timeout_s: float = 5.0) -> bool:
    """Wait until the background thread has taken ``count`` more samples; False on timeout."""
    target = sampler.samples + count
    deadline = time.monotonic() + timeout_s
    while sampler.samples < target:
        if time.monotonic() > deadline:
            return False
        time.sleep(sampler.interval_s / 2)
    return True

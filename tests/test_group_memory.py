"""The process-group memory sampler: peaks per process and of the group's sums, shared segments, calibration."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

import psutil
import pytest

from pitfalls.calibration import group_memory_checks as planted
from pitfalls.known.table import verdict
from pitfalls.probes import group_memory as gm
from pitfalls.result import Unavailable

# Timing and memory figures read against planted values: with the machine to themselves.
pytestmark = pytest.mark.serial

MIB = 1 << 20


class FakeTable:
    """A process table that plays back one list of members per sample."""

    def __init__(self, frames: list[list[gm.MemberSample]]) -> None:
        self.frames = frames
        self.calls = 0

    def __call__(self, _root_pid: int) -> list[gm.MemberSample]:
        frame = self.frames[min(self.calls, len(self.frames) - 1)]
        self.calls += 1
        return frame


def member(pid: int, rss: int, uss: int, pss: int) -> gm.MemberSample:
    return gm.MemberSample(pid=pid, name=f"p{pid}", rss=rss, uss=uss, pss=pss)


def no_shm(pids: Iterable[int]) -> dict[int, int]:
    return {}


def fake_sampler(frames: list[list[gm.MemberSample]], **kw: object) -> gm.GroupMemorySampler:
    return gm.GroupMemorySampler(1, interval_s=3600, members=FakeTable(frames), shm=kw.get("shm", no_shm),  # type: ignore[arg-type]
                                 cgroup=lambda: Unavailable("fake"))


def test_peak_of_the_sum_is_not_the_sum_of_the_peaks() -> None:
    # Two workers peak at different samples: the group never held 10 + 10 at once.
    frames = [[member(1, 5, 5, 5)],
              [member(1, 5, 5, 5), member(2, 10, 10, 10), member(3, 1, 1, 1)],
              [member(1, 5, 5, 5), member(2, 1, 1, 1), member(3, 10, 10, 10)]]
    s = fake_sampler(frames)
    with s:
        s.sample()
        s.sample()
    r = s.result
    assert r.peak_uss == 16 and r.peak_rss == 16 and r.peak_pss == 16
    assert r.baseline_uss == 5 and r.peak_processes == 3 and r.samples == 4
    assert {p.pid: p.uss for p in r.processes} == {1: 5, 2: 10, 3: 10}


def test_each_field_keeps_its_own_peak() -> None:
    frames = [[member(1, 10, 2, 4)], [member(1, 3, 7, 5)]]
    s = fake_sampler(frames)
    with s:
        pass
    (p,) = s.result.processes
    assert (p.rss, p.uss, p.pss) == (10, 7, 5)


def test_shared_segments_are_counted_once_by_inode() -> None:
    frames = [[member(1, 1, 1, 1), member(2, 1, 1, 1)]]
    s = fake_sampler(frames, shm=lambda pids: {7: 4 * MIB, 9: MIB} if len(list(pids)) == 2 else {})
    with s:
        pass
    assert s.result.peak_shm == 5 * MIB


def test_result_is_refused_while_the_window_is_open() -> None:
    s = fake_sampler([[member(1, 1, 1, 1)]])
    with s, pytest.raises(RuntimeError, match="still open"):
        _ = s.result


def test_bad_interval_is_refused() -> None:
    with pytest.raises(ValueError, match="interval_s"):
        gm.GroupMemorySampler(interval_s=0)


def test_real_members_include_this_process() -> None:
    (me, *_) = gm.group_members(os.getpid())
    assert me.pid == os.getpid() and 0 < me.uss <= me.pss <= me.rss


def test_a_group_of_named_members_leaves_out_the_roots_other_children() -> None:
    # Two children of this process: one a member (with a child of its own), one not (as a resource tracker is).
    sleeper = "import time; time.sleep(60)"
    member = subprocess.Popen([sys.executable, "-c", f"import subprocess, sys; subprocess.Popen([sys.executable, "
                               f"'-c', {sleeper!r}]); {sleeper}"])
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        deadline = time.monotonic() + 30
        while len(psutil.Process(member.pid).children()) < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        grandchild = psutil.Process(member.pid).children()[0].pid
        named = {m.pid for m in gm.members_named(lambda: [member.pid])(os.getpid())}
        everyone = {m.pid for m in gm.group_members(os.getpid())}
        assert named == {os.getpid(), member.pid, grandchild}
        assert {member.pid, grandchild, other.pid} <= everyone
        # A member that has ended is left out, not an error.
        other.kill()
        other.wait()
        assert {m.pid for m in gm.members_named(lambda: [other.pid])(os.getpid())} == {os.getpid()}
    finally:
        for proc in psutil.Process(member.pid).children(recursive=True):
            proc.kill()
        for proc in (member, other):
            proc.kill()
            proc.wait()


def test_real_shm_segment_is_found_through_proc() -> None:
    # A POSIX shared-memory segment is a file under /dev/shm. It is made by hand here: multiprocessing's
    # SharedMemory would start its resource tracker, a child of this process for the rest of the run, and every
    # later test's process group would count it.
    path = Path("/dev/shm") / f"pitfalls-test-{os.getpid()}"
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, 3 * MIB)
        found = gm.shm_segments([os.getpid()])
        assert 3 * MIB in found.values()
    finally:
        os.close(fd)
        path.unlink()
    assert 3 * MIB not in gm.shm_segments([os.getpid()]).values()


def test_cgroup_peak_names_its_file_or_says_why() -> None:
    got = gm.cgroup_peak()
    if isinstance(got, Unavailable):
        assert "tried" in got.reason
    else:
        path, value = got
        assert path.endswith(("memory.peak", "memory.max_usage_in_bytes")) and value > 0


def test_calibration_reads_the_planted_group() -> None:
    rows = [verdict(c, c.measure("cpu")) for c in planted.group_memory_checks()]
    assert [r.verdict for r in rows] == ["pass"] * 3, rows


def test_a_sampler_that_counts_only_the_parent_fails_calibration(monkeypatch: pytest.MonkeyPatch) -> None:
    def parent_only(root_pid: int) -> list[gm.MemberSample]:
        return [m for m in gm.group_members(root_pid) if m.pid == root_pid]

    class ParentOnly(gm.GroupMemorySampler):
        def __init__(self, *a: object, **kw: object) -> None:
            super().__init__(*a, members=parent_only, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(planted, "GroupMemorySampler", ParentOnly)
    rows = [verdict(c, c.measure("cpu")) for c in planted.group_memory_checks()]
    assert rows[0].verdict == "fail" and rows[0].measured is not None and rows[0].measured < 10

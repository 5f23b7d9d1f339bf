"""Known answer for the process-group memory sampler: W children each holding N MiB private and S MiB shared."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from dataclasses import dataclass

from pitfalls.known.one_run import OneRun
from pitfalls.known.table import GROUP_MEMORY, SHM_IN_FLIGHT, Check, Reading
from pitfalls.probes.group_memory import GroupMemory, GroupMemorySampler, group_members, shm_segments, wait_for_samples
from pitfalls.result import Unavailable
from pitfalls.units import MIB

__all__ = ["PlantedGroup", "group_memory_checks", "run_planted_group"]


# A child is a bare interpreter (no torch, no copy-on-write pages shared with the parent, whose splitting would
# move pages between USS and PSS while the window is open): it maps the segment and reports ready; on a first
# line it touches every shared page, on a second its private bytes, and holds them until its stdin closes. The
# shared pages are touched by all children first: the first child to touch a page holds it alone (in its USS)
# until the others touch it, and that transient must stay below the private peak that follows.
_CHILD = """
import mmap, os, sys
private_mib, path = int(sys.argv[1]), sys.argv[2]
fd = os.open(path, os.O_RDWR)
shared = mmap.mmap(fd, os.fstat(fd).st_size)
print("ready", flush=True)
sys.stdin.readline()
for offset in range(0, len(shared), 4096):
    shared[offset] = 2
print("shared", flush=True)
sys.stdin.readline()
private = bytearray(private_mib << 20)
private[::4096] = b"\\x01" * (len(private) // 4096)
print("held", flush=True)
sys.stdin.read()
"""


@dataclass(frozen=True)
class PlantedGroup:
    """The planted group: ``workers`` children, each touching ``private_mib`` of its own and all of ``shared_mib``."""

    workers: int = 2
    private_mib: int = 64
    shared_mib: int = 32


def _expect(child: subprocess.Popen[str], word: str) -> None:
    assert child.stdout is not None
    line = child.stdout.readline().strip()
    if line != word:
        raise RuntimeError(f"a planted child said {line!r} where {word!r} was expected (exit code {child.poll()})")


def run_planted_group(plan: PlantedGroup) -> GroupMemory:
    """Start the planted children, sample the group (baseline idle, then holding) with `GroupMemorySampler` (looked up
    when called: a test may plant a faulty one), and return the figures.

    Args:
        plan: how many children and how much each holds.

    Returns:
        The sampler's `GroupMemory`; its growth from baseline is the planted memory.
    """
    path = f"/dev/shm/pitfalls-calibration-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    with open(path, "wb") as fh:
        fh.truncate(plan.shared_mib * MIB)  # a hole: no page is resident until a child touches it
    children: list[subprocess.Popen[str]] = []
    try:
        fd = os.open(path, os.O_RDONLY)  # the parent holds it open, as a DataLoader's parent holds a batch
        for _ in range(plan.workers):
            children.append(subprocess.Popen(
                [sys.executable, "-I", "-c", _CHILD, str(plan.private_mib), path],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
        for child in children:
            _expect(child, "ready")
        with GroupMemorySampler(interval_s=0.01) as sampler:
            for word in ("shared", "held"):
                for child in children:
                    assert child.stdin is not None
                    child.stdin.write("go\n")
                    child.stdin.flush()
                for child in children:
                    _expect(child, word)
            if not wait_for_samples(sampler, 3):
                raise RuntimeError("the group memory sampler took no sample within 5 s")
        # Released only once the window has closed: a child tearing down its mappings while it is read would
        # leave its share of a shared page counted while the survivor is already charged the whole page.
        for child in children:
            assert child.stdin is not None
            child.stdin.close()
            child.wait(30)
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
            if child.stdout is not None:
                child.stdout.close()
        os.close(fd)
        os.unlink(path)
    return sampler.result


class _GroupRun:
    """The planted group, run once and read by the three rows (`OneRun`)."""

    def __init__(self, plan: PlantedGroup) -> None:
        self.plan = plan
        self.run: OneRun[tuple[GroupMemory, int]] = OneRun(self._measure)

    def _measure(self) -> tuple[GroupMemory, int]:
        # Segments the process held before the plant are its own business (a test run's earlier loaders left
        # a 4 KiB one mapped here); the planted one is made after this reading.
        held_before = sum(shm_segments(m.pid for m in group_members(os.getpid())).values())
        return run_planted_group(self.plan), held_before

    def uss(self, _device: str) -> Reading:
        (g, _), p = self.run.take("uss"), self.plan
        grown = (g.peak_uss - g.baseline_uss) / MIB
        return Reading(planted=p.workers * p.private_mib, measured=grown,
                       detail=f"{p.workers} children x {p.private_mib} MiB; {g.samples} samples, "
                              f"{g.peak_processes} processes")

    def pss(self, _device: str) -> Reading:
        g, _ = self.run.take("pss")
        shared = ((g.peak_pss - g.baseline_pss) - (g.peak_uss - g.baseline_uss)) / MIB
        return Reading(planted=self.plan.shared_mib, measured=shared,
                       detail=f"PSS-USS growth; RSS counts it {(g.peak_rss - g.baseline_rss) / MIB:.0f} MiB in all")

    def shm(self, _device: str) -> Reading:
        g, held_before = self.run.take("shm")
        if g.peak_shm == 0:
            return Reading(planted=self.plan.shared_mib, measured=Unavailable("no /dev/shm segment seen in /proc"))
        return Reading(planted=self.plan.shared_mib, measured=(g.peak_shm - held_before) / MIB,
                       detail=f"/proc/PID/fd and maps, less {held_before} bytes held before the plant")


def group_memory_checks(plan: PlantedGroup | None = None) -> tuple[Check, ...]:
    """The group-memory rows, read from one run: USS growth = W*N, the shared buffer once in PSS and /dev/shm."""
    run = _GroupRun(plan or PlantedGroup())
    return (
        Check(name="group memory: USS of W children", instruments=(GROUP_MEMORY,), unit="MiB", tolerance=0.05,
              measure=run.uss, why=""),
        Check(name="group memory: shared buffer once in PSS", instruments=(GROUP_MEMORY,), unit="MiB",
              tolerance=0.05, measure=run.pss, why=""),
        Check(name="group memory: /dev/shm in flight", instruments=(SHM_IN_FLIGHT,), unit="MiB", tolerance=0.0,
              measure=run.shm, why="a page-aligned segment: exact"),
    )

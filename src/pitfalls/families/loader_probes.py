"""The loader family's own figures: samples/s, bytes per batch, time to first batch, memory of the main process and
its workers (PSS/USS), batches and bytes in flight, and copy-on-write growth of the workers.

Memory is read with psutil's ``memory_full_info`` (Linux ``/proc/PID/smaps``): USS is what a process alone holds,
PSS also its share of what it shares. Summed over the main process and its workers, PSS counts every page once
where RSS would count a page shared by three processes three times. Batches that wait in the workers' queue are
neither: a worker collates each batch into shared memory and hands over a file descriptor, so until the main
process takes them they show in the system's ``Shmem`` (``psutil.virtual_memory().shared``), which the in-flight
figure reads.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psutil
import torch

from pitfalls.devices import synchronize
from pitfalls.families.loader import FAMILY, FLOOR, BatchStep, LoaderStep, make_step, nbytes
from pitfalls.family import SkipCase
from pitfalls.probes.result import Unavailable

_MIB = 2**20
# How often the workers' batch counters are read while the in-flight batches settle, and how long the queues'
# feeder threads then get to hand the last batch over.
SETTLE_POLL_S = 0.05
HAND_OVER_S = 0.25


def case_params(variant: str, device: str, sizes: Mapping[str, Any]) -> tuple[torch.device, dict[str, Any]]:
    """Resolve a benchmark's or a caller's arguments: the device (SkipCase if absent) and every parameter."""
    return FAMILY.place(variant, device, sizes)


@dataclass(frozen=True)
class GroupMemory:
    """Memory of the main process and its workers, summed (bytes)."""

    pss: int
    uss: int
    rss: int
    processes: int


def group_memory(worker_pids: Sequence[int]) -> GroupMemory:
    """PSS, USS and RSS of this process plus ``worker_pids``, summed; a worker that has exited counts 0."""
    pss = uss = rss = count = 0
    for pid in (psutil.Process().pid, *worker_pids):
        try:
            info = psutil.Process(pid).memory_full_info()
        except psutil.NoSuchProcess:
            continue
        pss, uss, rss, count = pss + info.pss, uss + info.uss, rss + info.rss, count + 1
    return GroupMemory(pss, uss, rss, count)


def _peak(a: GroupMemory, b: GroupMemory) -> GroupMemory:
    return GroupMemory(max(a.pss, b.pss), max(a.uss, b.uss), max(a.rss, b.rss), max(a.processes, b.processes))


def _synced(step: BatchStep) -> None:
    step()
    synchronize(step.device)


def samples_per_second(step: BatchStep, *, min_seconds: float = 1.0, min_batches: int = 3) -> float:
    """Samples per second of an already warmed-up step, over at least ``min_batches`` batches and ``min_seconds``.

    Each batch includes its copy to the device, the device-side normalize and the model step, synchronized.
    """
    synchronize(step.device)
    started = time.perf_counter()
    batches = 0
    while batches < min_batches or time.perf_counter() - started < min_seconds:
        _synced(step)
        batches += 1
    return batches * step.params["batch"] / (time.perf_counter() - started)


def batch_nbytes(step: BatchStep) -> int:
    """Bytes of one host batch as the loader hands it over (before the device copy), from its tensors."""
    return nbytes(step.next_batch())


def bytes_per_batch(variant: str, device: str, **sizes: Any) -> int:
    """Bytes of the first batch of a fresh loader, from its tensors (no warm-up: the size does not change)."""
    where, params = case_params(variant, device, sizes)
    step = make_step(variant, where, params)
    try:
        return batch_nbytes(step)
    finally:
        step.close()


def time_to_first_batch(variant: str, device: str, **sizes: Any) -> float:
    """Seconds from starting a fresh loader (its workers included) to its first batch consumed on the device.

    The data set is on disk (generated beforehand) and the RAM forms are loaded before the clock starts: this is
    what every new iterator pays (each epoch, without ``persistent_workers``).
    """
    where, params = case_params(variant, device, sizes)
    step = make_step(variant, where, params, start=False)
    try:
        started = time.perf_counter()
        step.start()
        _synced(step)
        return time.perf_counter() - started
    finally:
        step.close()


def peak_memory(variant: str, device: str, *, batches: int | None = None, **sizes: Any) -> GroupMemory:
    """Peak PSS, USS and RSS of the main process plus its workers while a fresh loader delivers batches.

    Args:
        variant: a variant or the floor.
        device: "cpu" or "cuda".
        batches: batches to consume; default an epoch plus the batches in flight, at least 3.
        **sizes: the family's parameters. A case with more workers than cores is measured (memory does not
            depend on cores); one that does not fit in RAM is skipped.

    Returns:
        The peaks, each sampled after every batch (the sums peak separately).
    """
    where, params = case_params(variant, device, sizes)
    in_flight = params["num_workers"] * params["prefetch_factor"]
    count = batches or max(3, math.ceil(params["items"] / params["batch"]) + in_flight)
    step = make_step(variant, where, params, check_cores=False)
    try:
        peak = group_memory(step.worker_pids())
        for _ in range(count):
            _synced(step)
            peak = _peak(peak, group_memory(step.worker_pids()))
        return peak
    finally:
        step.close()


@dataclass(frozen=True)
class InFlight:
    """Batches made by the workers but not yet consumed, once the loader has settled.

    Attributes:
        batches: counted by the workers' collate function, minus the batches consumed.
        measured_bytes: torch's shared-memory segments held by the main process and its workers (each counted
            once), plus, when batches are pinned, the main process's USS growth since just before the workers
            started (the pin thread copies batches off the queue into page-locked memory).
        bytes_per_batch: one batch as handed over, from its tensors.
        workers: num_workers.
        prefetch_factor: the DataLoader's prefetch_factor.
    """

    batches: int
    measured_bytes: int
    bytes_per_batch: int
    workers: int
    prefetch_factor: int

    @property
    def article_bytes(self) -> int:
        """The article's arithmetic: one batch per worker."""
        return self.workers * self.bytes_per_batch

    @property
    def prefetch_bytes(self) -> int:
        """DataLoader's: ``prefetch_factor`` batches per worker."""
        return self.workers * self.prefetch_factor * self.bytes_per_batch


def torch_shared_segments(pids: Sequence[int]) -> dict[int, int]:
    """torch's shared-memory segments that ``pids`` hold open or mapped: inode -> bytes, each segment once.

    A worker collates a batch into a segment of ``/dev/shm`` (named ``torch_*``, unlinked at once) and passes
    its file descriptor on; until the main process consumes the batch, a worker or the main process holds it.
    Reads ``/proc/PID/fd`` and ``/proc/PID/maps`` (Linux); a process that has exited holds nothing.
    """
    segments: dict[int, int] = {}
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                path = f"/proc/{pid}/fd/{fd}"
                try:
                    if "/torch_" in os.readlink(path):
                        stat = os.stat(path)
                        segments[stat.st_ino] = max(segments.get(stat.st_ino, 0), stat.st_size)
                except OSError:  # closed between listing and reading
                    continue
            with open(f"/proc/{pid}/maps", encoding="utf-8") as maps:
                for line in maps:
                    fields = line.split()
                    if len(fields) >= 6 and "/torch_" in fields[5]:
                        low, high = (int(x, 16) for x in fields[0].split("-"))
                        inode = int(fields[4])
                        segments[inode] = max(segments.get(inode, 0), high - low)
        except (FileNotFoundError, ProcessLookupError):
            continue
    return segments


def _settle(made: Callable[[], int], expected: int, deadline_s: float) -> None:
    """Wait until ``made()`` reaches ``expected`` or ``deadline_s`` passes (then the figure shows the shortfall)."""
    deadline = time.monotonic() + deadline_s
    while made() < expected and time.monotonic() < deadline:
        time.sleep(SETTLE_POLL_S)


def in_flight(variant: str, device: str, *, consumed: int = 2, **sizes: Any) -> InFlight:
    """Batches and bytes in flight once a fresh loader has delivered ``consumed`` batches and then rests.

    DataLoader keeps ``prefetch_factor`` index batches outstanding per worker and sends a new one for each
    batch taken, so at rest the workers have made that many batches ahead of the consumer.

    Raises:
        SkipCase: no workers (batches are made on demand, nothing is in flight), the floor, or no room.
    """
    where, params = case_params(variant, device, sizes)
    workers = params["num_workers"]
    if variant == FLOOR or workers == 0:
        raise SkipCase(f"nothing is in flight {'for the floor' if variant == FLOOR else 'with num_workers=0'}: "
                       "batches are made on demand in the main process")
    step = make_step(variant, where, params, check_cores=False, start=False)
    assert isinstance(step, LoaderStep)
    try:
        main_uss = psutil.Process().memory_full_info().uss
        # Segments this process maps already (another loader's batches still referenced) are not this loader's.
        earlier = set(torch_shared_segments([os.getpid()]))
        step.start()
        per_batch = 0
        for _ in range(consumed):
            per_batch = nbytes(step.next_batch())
        expected = consumed + workers * params["prefetch_factor"]
        _settle(step.board.batches_made, expected, deadline_s=float(params["timeout"] or 120))

        def held_now() -> int:
            segments = torch_shared_segments([os.getpid(), *step.worker_pids()])
            held = sum(size for inode, size in segments.items() if inode not in earlier)
            return held + (psutil.Process().memory_full_info().uss - main_uss if step.pin else 0)

        # The last batches made may still be on their way into shared memory (a queue's feeder thread hands each
        # over): read until two readings agree, so a busy machine does not catch one half-way.
        held, deadline = held_now(), time.monotonic() + float(params["timeout"] or 120)
        while time.monotonic() < deadline:
            time.sleep(HAND_OVER_S)
            again = held_now()
            if again == held:
                break
            held = again
        return InFlight(step.board.batches_made() - consumed, held, per_batch, workers, params["prefetch_factor"])
    finally:
        step.close()


@dataclass(frozen=True)
class CopyOnWrite:
    """How the workers' private memory (USS) grew: at start-up, then while they read items.

    Attributes:
        startup: bytes each worker's USS grew from its start to the start of its second batch: its first batch,
            plus the pages of the interpreter and libraries a forked process writes once (reference counts, the
            garbage collector), whatever the data.
        window: bytes each worker's USS grew from the start of its second batch to the start of its latest.
        items_read: items the workers read in that window, together.
        storage: "list" or "packed".
    """

    startup: tuple[int, ...]
    window: tuple[int, ...]
    items_read: int
    storage: str

    @property
    def per_item(self) -> float:
        """Window growth summed over workers, per item read: what reading one item copies."""
        return sum(self.window) / max(self.items_read, 1)


def copy_on_write(variant: str, device: str, *, epochs: int = 1, **sizes: Any) -> CopyOnWrite:
    """Worker USS growth of a fresh loader over ``epochs`` epochs of items read, after each worker's first batch.

    Forked workers share the parent's pages until they write to them. Reading an item of a Python list writes
    its reference count, so the list form copies the page holding each item read (two objects per item here:
    image and mask); the packed form is a few objects whatever the item count. Each worker reads its USS when
    it starts and at the start of each batch, before loading an item (see `WorkerBoard`), so the window's
    growth is not blurred by the batch a worker happens to be making.

    Raises:
        SkipCase: no workers, the floor, workers that do not fork (nothing is shared with the parent), or no room.
    """
    where, params = case_params(variant, device, sizes)
    if variant == FLOOR or params["num_workers"] == 0:
        raise SkipCase("no worker process: " + ("the floor has no loader" if variant == FLOOR else "num_workers=0"))
    if params["start_method"] != "fork":
        raise SkipCase(f"start_method={params['start_method']!r} workers get a pickled copy of the data set, not "
                       "the parent's pages: nothing is copied on write")
    step = make_step(variant, where, params, check_cores=False, measure_uss=True)
    assert isinstance(step, LoaderStep)
    try:
        # Each worker's first batch is before the window: consume one more per worker, so that the window
        # still holds ``epochs`` epochs of reads.
        for _ in range(epochs * math.ceil(params["items"] / params["batch"]) + params["num_workers"] + 1):
            _synced(step)
        board, startup, window, read = step.board, [], [], 0
        for slot in range(len(board.pids)):
            if board.batches_started[slot] >= 2:
                startup.append(int(board.uss_reference[slot] - board.uss_at_start[slot]))
                window.append(int(board.uss_latest[slot] - board.uss_reference[slot]))
                read += (board.batches_started[slot] - 2) * params["batch"]
        return CopyOnWrite(tuple(startup), tuple(window), read, params["storage"])
    finally:
        step.close()


def batch_step(case: Any) -> BatchStep:
    """The `BatchStep` a loader case calls (``Case.call``), for the figures that measure a built case."""
    if not isinstance(case.call, BatchStep):
        raise TypeError(f"{case.name} is not a loader case: its call is a {type(case.call).__name__}")
    return case.call


MIB = 2**20


def _or_reason(measure: Callable[[], Any]) -> Any:
    """A figure, or `Unavailable` with the reason when it cannot be measured for this case."""
    try:
        return measure()
    except SkipCase as skip:
        return Unavailable(skip.reason)


def own_figures(case: Any) -> list[tuple[str, Any, str, str]]:
    """The loader family's own figures of one case, for ``pitfalls probe`` (bench_loader.py has each as a class)."""
    variant, device, sizes = case.variant, str(case.device), dict(case.params)
    memory = _or_reason(lambda: peak_memory(variant, device, **sizes))
    flight = _or_reason(lambda: in_flight(variant, device, **sizes))
    growth = _or_reason(lambda: copy_on_write(variant, device, **sizes))

    def part(value: Any, read: Callable[[Any], Any]) -> Any:
        return value if isinstance(value, Unavailable) else read(value)

    formulas = part(flight, lambda f: f"DataLoader's workers x prefetch_factor x batch = {f.prefetch_bytes / MIB:.1f} "
                                      f"MiB; the article's workers x batch = {f.article_bytes / MIB:.1f} MiB")
    return [
        ("samples per second", samples_per_second(batch_step(case)), "samples/s",
         "loading, copy to the device, normalize and the model step, synchronized"),
        ("bytes per batch", bytes_per_batch(variant, device, **sizes), "bytes", "from the tensors handed over"),
        ("time to first batch", _or_reason(lambda: time_to_first_batch(variant, device, **sizes)), "s",
         "a fresh loader, its workers' start included"),
        ("peak PSS, main + workers", part(memory, lambda m: m.pss / MIB), "MiB", "a shared page counted once"),
        ("peak USS, main + workers", part(memory, lambda m: m.uss / MIB), "MiB", "pages private to one process"),
        ("batches in flight", part(flight, lambda f: f.batches), "batches", "made ahead of the consumer, at rest"),
        ("bytes in flight", part(flight, lambda f: f.measured_bytes / MIB), "MiB",
         formulas if isinstance(formulas, str) else ""),
        ("copied per item read (copy-on-write)", part(growth, lambda g: g.per_item / 1024), "KiB/item",
         f"storage={sizes.get('storage')}: worker USS growth over an epoch"),
    ]

"""The loader family's own figures: samples/s, bytes per batch, time to first batch, memory of the main process and
its workers (PSS/USS), batches and bytes in flight, and copy-on-write growth of the workers.

Memory is read with psutil's ``memory_full_info`` (Linux ``/proc/PID/smaps``): USS is what a process alone holds,
PSS also its share of what it shares. Summed over the main process and its workers, PSS counts every page once
where RSS would count a page shared by three processes three times. The peak figures are the whole group's,
sampled in the background during the run (`memory.group_peak`). Batches that wait in the workers' queue
are in neither sum: a worker collates each batch into a torch shared-memory segment and hands over its file
descriptor, so the in-flight figure finds the segments through ``/proc/PID/fd`` and ``/proc/PID/maps`` of the main
process and its workers (the shared, calibrated `pitfalls.probes.group_memory.shm_segments`), each counted once.

Each figure that runs a loader has a ``*_of(step)`` form that reads it from a built step (`in_flight_of`,
`time_to_first_batch_of`, `copy_on_write_of`, `batch_nbytes`, `epochs.epoch_starts_of`): the published figure
builds the case's step and calls it, and the calibration (`flight_checks`, `start_checks`, `memory_checks`) calls
the same routine on a step of a planted data set.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from pitfalls.families.loader import steady
from pitfalls.families.loader.entry import ENTRY, read_case
from pitfalls.families.loader.epochs import epoch_starts
from pitfalls.families.loader.steps import BatchStep, LoaderStep, make_step
from pitfalls.families.loader.variants import nbytes
from pitfalls.families.loader.verdict import STARVES_BELOW, judge
from pitfalls.families.loader.workers import forked_workers_only
from pitfalls.family import FLOOR, SkipCase
from pitfalls.probes.group_memory import GroupMemory, GroupMemorySampler, members_named, shm_segments
from pitfalls.result import Unavailable
from pitfalls.units import MIB

# A worker's USS moves by this much between two readings with nothing copied: with a planted data set that copies
# nothing, and on the quick grid's rungs, the window's growth read -2.2 to +0.9 MiB per worker here (the heap that
# malloc_trim returns, OpenCV's buffers, the interpreter's own). A growth below it is no copy-on-write figure.
COW_NOISE_FLOOR_BYTES = 3 * MIB
# How often the workers' batch counters are read while the in-flight batches settle, and how long the queues'
# feeder threads then get to hand the last batch over.
SETTLE_POLL_S = 0.05
HAND_OVER_S = 0.25
# Batches a fresh loader delivers before it rests and its batches in flight are read.
CONSUMED = 2


# The group's peak is sampled every 15 ms: a batch of 32 at 128 x 128 collates in tens of ms on this machine, so
# its peak is seen. The cgroup's own peak is not used: on this machine only cgroup v1's memory.max_usage_in_bytes of
# the whole container is there, a ceiling of everything running in it, not the loader's figure.
SAMPLE_INTERVAL_S = 0.015
def group_peak(step: BatchStep, batches: int) -> GroupMemory:
    """The peak memory of the step's whole group (this process and its workers, `BatchStep.worker_pids`) over
    ``batches`` calls. Other children of this process (a resource tracker, a compile pool) are not the loader's.

    Args:
        step: a batch step, started.
        batches: synchronized calls to make while sampling.

    Returns:
        The sampler's figures: per-process peaks and the group's peaks of the PSS, USS and RSS sums.
    """
    with GroupMemorySampler(interval_s=SAMPLE_INTERVAL_S, members=members_named(step.worker_pids)) as sampler:
        for _ in range(batches):
            step.synced()
    return sampler.result


def samples_per_second(step: BatchStep, *, min_seconds: float = steady.MIN_SECONDS) -> float:
    """Samples per second of a case at steady state (`steady.run`: fresh workers, the batches they could have
    made in advance discarded, then at least ten times as many timed, for at least ``min_seconds``).

    Each batch includes its copy to the device, the device-side normalize and the model step, synchronized.
    """
    return steady.run(step, min_seconds=min_seconds).samples_per_second


def batch_nbytes(step: BatchStep) -> int:
    """Bytes of one host batch as the loader hands it over (before the device copy), from its tensors."""
    return nbytes(step.next_batch())


def bytes_per_batch(variant: str, device: str, **sizes: Any) -> int:
    """Bytes of the first batch of a fresh loader, from its tensors (no warm-up: the size does not change)."""
    return read_case(variant, device, sizes, batch_nbytes)


def time_to_first_batch(variant: str, device: str, **sizes: Any) -> float:
    """Seconds from starting a fresh loader (its workers included) to its first batch consumed on the device.

    The data set is on disk (generated beforehand) and the RAM forms are loaded before the clock starts: this is
    what every new iterator pays (each epoch, without ``persistent_workers``).
    """
    return read_case(variant, device, sizes, time_to_first_batch_of, start=False)


def time_to_first_batch_of(step: BatchStep) -> float:
    """Seconds from starting a built, not yet started step to its first batch consumed on the device, synchronized.

    Args:
        step: built with ``start=False`` (its workers start inside the timed span).

    Returns:
        Seconds from ``step.start()`` to the first call's end.

    Raises:
        ValueError: the step's loader was started already (its workers' start would be missing from the span).
    """
    if isinstance(step, LoaderStep) and step.iterator is not None:
        raise ValueError(f"{step.variant}: the step was started before the clock; build it with start=False")
    started = time.perf_counter()
    step.start()
    step.synced()
    return time.perf_counter() - started


def peak_memory(variant: str, device: str, **sizes: Any) -> GroupMemory:
    """Peak PSS, USS and RSS of the whole loader group (the main process and every worker) while a fresh loader
    delivers an epoch plus the batches in flight (at least 3), sampled every 15 ms in the background
    (`group_peak`), collation included.

    Args:
        variant: a variant or the floor.
        device: "cpu" or "cuda".
        **sizes: the family's parameters. A case with more workers than cores is measured (memory does not
            depend on cores); one that does not fit in RAM is skipped.

    Returns:
        The sampler's figures: the group's peaks of the PSS, USS and RSS sums and each process's own.
    """
    where, params = ENTRY.place(variant, device, sizes)
    in_flight = params["num_workers"] * params["prefetch_factor"]
    count = max(3, math.ceil(params["items"] / params["batch"]) + in_flight)
    with make_step(variant, where, params, check_cores=False) as step:
        return group_peak(step, count)


@dataclass(frozen=True)
class InFlight:
    """Batches made by the workers but not yet consumed, once the loader has settled.

    Attributes:
        batches: counted by the workers' collate function, minus the batches consumed.
        measured_bytes: torch's shared-memory segments held by the main process and its workers (each counted
            once); n/a when batches are pinned: the pin thread copies batches off the queue into page-locked
            memory of the main process, which no ``/proc`` reading tells apart from its other memory.
        bytes_per_batch: one batch as handed over, from its tensors.
        workers: num_workers.
        prefetch_factor: the DataLoader's prefetch_factor.
    """

    batches: int
    measured_bytes: int | Unavailable
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


def _settle(made: Callable[[], int], expected: int, deadline_s: float) -> None:
    """Wait until ``made()`` reaches ``expected`` or ``deadline_s`` passes (then the figure shows the shortfall)."""
    deadline = time.monotonic() + deadline_s
    while made() < expected and time.monotonic() < deadline:
        time.sleep(SETTLE_POLL_S)


# Reads the shared-memory segments a set of processes holds: inode -> bytes, each once (`shm_segments`).
Segments = Callable[[Iterable[int]], dict[int, int]]


def _nothing_in_flight(variant: str, workers: int) -> None:
    if variant == FLOOR or workers == 0:
        raise SkipCase(f"nothing is in flight {'for the floor' if variant == FLOOR else 'with num_workers=0'}: "
                       "batches are made on demand in the main process")


def in_flight(variant: str, device: str, **sizes: Any) -> InFlight:
    """Batches and bytes in flight once a fresh loader has delivered `CONSUMED` batches and then rests.

    DataLoader keeps ``prefetch_factor`` index batches outstanding per worker and sends a new one for each
    batch taken, so at rest the workers have made that many batches ahead of the consumer.

    Raises:
        SkipCase: no workers (batches are made on demand, nothing is in flight), the floor, or no room.
    """
    where, params = ENTRY.place(variant, device, sizes)
    _nothing_in_flight(variant, params["num_workers"])
    with make_step(variant, where, params, check_cores=False, start=False) as step:
        return in_flight_of(step)  # type: ignore[arg-type]


def in_flight_of(step: LoaderStep, *, segments: Segments = shm_segments) -> InFlight:
    """The in-flight figures of a built, not yet started loader step (its parameters are ``step.params``): at rest
    after `CONSUMED` batches, once the workers have made the batches DataLoader asks of them ahead.

    Args:
        step: built with ``start=False``, so that the segments this process holds before are told apart.
        segments: the segment reader (`shm_segments`, the calibrated shared instrument).

    Returns:
        The `InFlight` figures; ``measured_bytes`` is n/a for pinned batches.

    Raises:
        SkipCase: no workers.
        ValueError: the step was started already.
    """
    params = step.params
    workers = params["num_workers"]
    _nothing_in_flight(step.variant, workers)
    if step.iterator is not None:
        raise ValueError(f"{step.variant}: the step was started before its segments were told apart; build it with "
                         "start=False")
    # Segments this process maps already (another loader's batches still referenced, the workers' board made with
    # the step) are not this loader's batches.
    earlier = set(segments([os.getpid()]))
    step.start()
    per_batch = 0
    for _ in range(CONSUMED):
        per_batch = batch_nbytes(step)
    expected = CONSUMED + workers * params["prefetch_factor"]
    _settle(step.board.batches_made, expected, deadline_s=float(params["timeout"] or 120))

    def held_now() -> int:
        found = segments([os.getpid(), *step.worker_pids()])
        return sum(size for inode, size in found.items() if inode not in earlier)

    # The last batches made may still be on their way into shared memory (a queue's feeder thread hands each
    # over): read until two readings agree, so a busy machine does not catch one half-way.
    held, deadline = held_now(), time.monotonic() + float(params["timeout"] or 120)
    while time.monotonic() < deadline:
        time.sleep(HAND_OVER_S)
        again = held_now()
        if again == held:
            break
        held = again
    measured: int | Unavailable = held
    if step.pin:
        measured = Unavailable("pinned batches: the pin thread holds copies in page-locked memory of the main "
                               "process, which no /proc reading tells apart from its other memory")
    return InFlight(step.board.batches_made() - CONSUMED, measured, per_batch, workers, params["prefetch_factor"])


@dataclass(frozen=True)
class CopyOnWrite:
    """How the workers' private memory (USS) grew while they read items, after their first batch (which holds the
    pages of the interpreter and libraries a forked process writes once, whatever the data).

    Attributes:
        window: bytes each worker's USS grew from the start of its second batch to the start of its latest.
        items_read: items the workers read in that window, together.
    """

    window: tuple[int, ...]
    items_read: int

    @property
    def per_item(self) -> float | Unavailable:
        """Window growth summed over workers, per item read: what reading one item copies; n/a when no item was
        read in the window (a growth over nothing read is no figure, not 0), and n/a when the growth is below
        `COW_NOISE_FLOOR_BYTES` per worker (a negative one among them: a heap cannot un-copy a page, it shrank)."""
        if self.items_read <= 0:
            return Unavailable("no item was read after the workers' first batch: nothing to divide the growth by")
        floor = COW_NOISE_FLOOR_BYTES * len(self.window)
        if sum(self.window) < floor:
            return Unavailable(f"the workers grew {sum(self.window) / 1024:+,.0f} KiB over {self.items_read} items "
                               f"read, below the noise floor of {COW_NOISE_FLOOR_BYTES / MIB:g} MiB per worker (a "
                               "worker's heap moves that much between readings with nothing copied): read more items")
        return sum(self.window) / self.items_read


def copy_on_write(variant: str, device: str, **sizes: Any) -> CopyOnWrite:
    """Worker USS growth of a fresh loader over an epoch of items read, after each worker's first batch.

    Forked workers share the parent's pages until they write to them. Reading an item of a Python list writes
    its reference count, so the list form copies the page holding each item read (two objects per item here:
    image and mask); the packed form is a few objects whatever the item count. Each worker reads its USS when
    it starts and at the start of each batch, before loading an item (see `WorkerBoard`), so the window's
    growth is not blurred by the batch a worker happens to be making.

    Raises:
        SkipCase: no workers, the floor, workers that do not fork (nothing is shared with the parent), or no room.
    """
    where, params = ENTRY.place(variant, device, sizes)
    if variant == FLOOR:
        raise SkipCase("no worker process: the floor has no loader")
    forked_workers_only(params["num_workers"], params["start_method"])
    with make_step(variant, where, params, check_cores=False, measure_uss=True) as step:
        return copy_on_write_of(step)  # type: ignore[arg-type]


def copy_on_write_of(step: LoaderStep, epochs: int = 1) -> CopyOnWrite:
    """The copy-on-write figure of a started step built with ``measure_uss``: ``epochs`` epochs of reads after
    each worker's first batch (the calibration plants a known copy through this same reading)."""
    params = step.params
    # Each worker's first batch is before the window: consume one more per worker, so that the window still holds
    # ``epochs`` epochs of reads.
    for _ in range(epochs * math.ceil(params["items"] / params["batch"]) + params["num_workers"] + 1):
        step.synced()
    board, window, read = step.board, [], 0
    for slot in range(len(board.pids)):
        batch, uss = board.uss_reading(slot)
        if batch >= 2:
            window.append(int(uss - board.uss_reference[slot]))
            read += (batch - 2) * params["batch"]
    return CopyOnWrite(tuple(window), read)


def batch_step(case: Any) -> BatchStep:
    """The `BatchStep` a loader case calls (``Case.call``), for the figures that measure a built case."""
    if not isinstance(case.call, BatchStep):
        raise TypeError(f"{case.name} is not a loader case: its call is a {type(case.call).__name__}")
    return case.call




def _or_reason(measure: Callable[[], Any]) -> Any:
    """A figure, or `Unavailable` with the reason when it cannot be measured for this case."""
    try:
        return measure()
    except SkipCase as skip:
        return Unavailable(skip.reason)


# The names `own_figures` gives the figures the loader's calibration checks read (and the asv methods that publish
# them, `pitfalls.family.Family.benchmark_figures`).
SAMPLES_PER_SECOND = "samples per second"
WAIT_SHARE = "wait share in next()"
PEAK_PSS = "peak PSS, main + workers"
PEAK_USS = "peak USS, main + workers"
COPIED_PER_ITEM = "copied per item read (copy-on-write)"
BYTES_PER_BATCH = "bytes per batch"
BATCHES_IN_FLIGHT = "batches in flight"
BYTES_IN_FLIGHT = "bytes in flight"
TIME_TO_FIRST_BATCH = "time to first batch"
EPOCH_START_FRESH = "epoch start, persistent_workers off"
EPOCH_START_PERSISTENT = "epoch start, persistent_workers on"


def own_figures(case: Any) -> list[tuple[str, Any, str, str]]:
    """The loader family's own figures of one case, for ``pitfalls probe`` (bench_loader.py has each as a class)."""
    variant, device, sizes = case.variant, str(case.device), dict(case.params)
    memory = _or_reason(lambda: peak_memory(variant, device, **sizes))
    flight = _or_reason(lambda: in_flight(variant, device, **sizes))
    growth = _or_reason(lambda: copy_on_write(variant, device, **sizes))

    def part(value: Any, read: Callable[[Any], Any]) -> Any:
        return value if isinstance(value, Unavailable) else read(value)

    run = steady.run(batch_step(case))
    judged = judge(run, batch_step(case).prefetching_workers)
    starts = _or_reason(lambda: epoch_starts(variant, device, **sizes))
    formulas = part(flight, lambda f: f"DataLoader's workers x prefetch_factor x batch = {f.prefetch_bytes / MIB:.1f} "
                                      f"MiB; the article's workers x batch = {f.article_bytes / MIB:.1f} MiB")
    return [
        (SAMPLES_PER_SECOND, run.samples_per_second, "samples/s",
         "loading, copy to the device, normalize and the model step, synchronized"),
        (WAIT_SHARE, judged.wait_share, "share", judged.describe()),
        (STARVES_BELOW, part(judged.starves_below_s, lambda s: s * 1e3), "ms",
         f"the step cost (model_ms={sizes.get('model_ms')} adds to the model step) below which the wait share "
         f"exceeds {judged.threshold:.0%}"),
        (BYTES_PER_BATCH, bytes_per_batch(variant, device, **sizes), "bytes", "from the tensors handed over"),
        (TIME_TO_FIRST_BATCH, _or_reason(lambda: time_to_first_batch(variant, device, **sizes)), "s",
         "a fresh loader, its workers' start included"),
        (EPOCH_START_FRESH, part(starts, lambda e: e.fresh), "s",
         "the next epoch's first batch: new workers"),
        (EPOCH_START_PERSISTENT, part(starts, lambda e: e.persistent), "s",
         "the next epoch's first batch: the same workers"),
        (PEAK_PSS, part(memory, lambda m: m.peak_pss / MIB), "MiB", "a shared page counted once"),
        (PEAK_USS, part(memory, lambda m: m.peak_uss / MIB), "MiB", "pages private to one process"),
        (BATCHES_IN_FLIGHT, part(flight, lambda f: f.batches), "batches", "made ahead of the consumer, at rest"),
        (BYTES_IN_FLIGHT, part(flight, lambda f: part(f.measured_bytes, lambda b: b / MIB)), "MiB",
         formulas if isinstance(formulas, str) else ""),
        (COPIED_PER_ITEM, part(growth, lambda g: part(g.per_item, lambda b: b / 1024)),
         "KiB/item",
         f"storage={sizes.get('storage')}: worker USS growth over an epoch"),
    ]

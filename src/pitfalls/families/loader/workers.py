"""DataLoader machinery: the endless sampler, the workers' shared board, their start and their shutdown."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import itertools
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psutil
import torch
from torch.utils.data import Dataset, Sampler, get_worker_info

from pitfalls.families.loader.data import single_threaded_opencv
from pitfalls.family import SkipCase


class CyclingSampler(Sampler[int]):
    """Seeded permutations of the items, epoch after epoch, without end.

    One iterator then serves every call of a case: its workers live as long as the case, and no epoch boundary
    empties the prefetch queue (an effect of the item count, not of the loading method).
    """

    def __init__(self, items: int, seed: int) -> None:
        self.items = items
        self.seed = seed

    def __iter__(self) -> Iterator[int]:
        for epoch in itertools.count():
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            yield from torch.randperm(self.items, generator=generator).tolist()


def release_free_heap() -> None:
    """Return the C heap's free memory to the system (glibc ``malloc_trim``), where that exists.

    A worker frees a whole batch of per-item tensors after each batch; whether the allocator keeps those pages
    would otherwise swing its USS by tens of MiB from one reading to the next.
    """
    try:
        libc = ctypes.CDLL(None)
        trim = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc: nothing to trim with
        return
    trim(0)


def settle_before_fork() -> None:
    """Collect the garbage and trim the C heap, just before workers fork from this process to be measured.

    A forked worker inherits the collector's counts. With many young objects pending (a process that has just
    imported a benchmark suite, as asv's benchmark process has), its first full collection falls in the measured
    window and writes the header of every container it inherited, copying their pages: 8 MiB a worker in asv's
    process here, 55 % over the copy-on-write row's planted 16 MiB, copied by no item read. After a full
    collection here the worker's next one is far off.
    """
    gc.collect()
    release_free_heap()


def uss_without_batches(pid: int | None = None) -> int:
    """The USS of process ``pid`` (None: this one) less the pages of torch's shared-memory segments it maps (the
    batches it is handing over), which move from one process's USS to shared as soon as the main process maps them."""
    maps = psutil.Process(pid).memory_maps(grouped=True)
    return sum(m.private_clean + m.private_dirty for m in maps if "/torch_" not in m.path)


class WorkerBoard:
    """Per-worker slots in shared memory that the workers write: pid, batches made and, when asked, their USS.

    Created from the loader's multiprocessing context, without locks: each worker writes only its own slot. With
    ``measure_uss`` a worker records its USS (`uss_without_batches`) when it starts, and at the start of every
    batch, before it loads an item, after returning its free heap (`release_free_heap`): the second batch's value
    is the reference, the latest the current value, so the growth between them is measured at the same point of
    the worker's cycle, without the batches it is handing over. `uss_reading` gives the latest value with the
    batch it was taken at, never one with the other's neighbour.
    """

    def __init__(self, workers: int, context: Any, *, measure_uss: bool = False) -> None:
        slots = max(workers, 1)
        self.pids = context.RawArray("q", slots)
        self.batches = context.RawArray("q", slots)
        self.batches_started = context.RawArray("q", slots)
        self.uss_at_start = context.RawArray("d", slots)
        self.uss_reference = context.RawArray("d", slots)
        self.uss_latest = context.RawArray("d", slots)
        # The batch at which ``uss_latest`` was taken, -1 while the worker rewrites the pair: reading the batch
        # count and the USS apart once charged a whole batch's copies to the window that had not yet seen them
        # (the worker counts a batch, then takes milliseconds to read its maps).
        self.uss_batch = context.RawArray("q", slots)
        self.measure_uss = measure_uss

    def started(self, worker_id: int) -> None:
        if self.measure_uss:
            self.uss_at_start[worker_id] = float(uss_without_batches())
        self.pids[worker_id] = os.getpid()

    def batch_starting(self, worker_id: int) -> None:
        self.batches_started[worker_id] += 1
        release_free_heap()
        uss = float(uss_without_batches())
        batch = self.batches_started[worker_id]
        self.uss_batch[worker_id] = -1
        if batch == 2:
            self.uss_reference[worker_id] = uss
        self.uss_latest[worker_id] = uss
        self.uss_batch[worker_id] = batch

    def uss_reading(self, slot: int) -> tuple[int, float]:
        """The worker's latest USS with the batch it was taken at (0 before its first), read as one pair."""
        while True:
            batch = self.uss_batch[slot]
            uss = self.uss_latest[slot]
            if batch >= 0 and self.uss_batch[slot] == batch:
                return int(batch), float(uss)
            time.sleep(0.0001)

    def made_batch(self, worker_id: int) -> None:
        self.batches[worker_id] += 1

    def worker_pids(self) -> list[int]:
        return [int(pid) for pid in self.pids if pid]

    def batches_made(self) -> int:
        return int(sum(self.batches))


class UssAtBatchStart(Dataset[Any]):
    """Wraps a data set so that a worker records its USS before it loads each batch (``__getitems__``, which
    DataLoader's fetcher calls with a batch's indices)."""

    def __init__(self, dataset: Dataset[Any], board: WorkerBoard) -> None:
        self.dataset = dataset
        self.board = board

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> Any:
        return self.dataset[index]

    def __getitems__(self, indices: list[int]) -> list[Any]:
        info = get_worker_info()
        if info is not None:
            self.board.batch_starting(info.id)
        return [self.dataset[i] for i in indices]


class WorkerInit:
    """``worker_init_fn``: one OpenCV thread per worker (as DataLoader gives torch one), and the board's slot.

    A forked worker inherits its parent's single thread (see `single_threaded_opencv`); a spawned one sets it.
    A worker whose parent is already gone when it starts exits at once: DataLoader's worker notes its parent's pid
    only after this function (its ``ManagerWatchdog``), so a worker that starts late, on a loaded machine, after
    its parent ended abruptly (``os._exit``, as asv's forkserver ends a benchmark) records its new parent, never
    sees the old one die, and waits on its index queue forever (seen in CI: one of two workers left after 30 s).
    """

    def __init__(self, board: WorkerBoard) -> None:
        self.board = board
        self.parent = os.getpid()  # built in the process that starts the workers

    def __call__(self, worker_id: int) -> None:
        if os.getppid() != self.parent:
            os._exit(0)  # no one is left to hand a batch to, or to report an error to
        single_threaded_opencv()
        self.board.started(worker_id)


class CountingCollate:
    """A ``collate_fn`` that also counts, per worker, the batches made (for the batches-in-flight figure)."""

    def __init__(self, board: WorkerBoard, collate: Callable[[list[Any]], Any]) -> None:
        self.board = board
        self.collate = collate

    def __call__(self, items: list[Any]) -> Any:
        batch = self.collate(items)
        info = get_worker_info()
        if info is not None:
            self.board.made_batch(info.id)
        return batch


def forked_workers_only(workers: int, start_method: str) -> None:
    """Raise SkipCase unless workers fork from this process: only they share its pages, to copy them on write."""
    if workers < 1:
        raise SkipCase("num_workers=0: no worker process, nothing is copied on write")
    if start_method != "fork":
        raise SkipCase(f"start_method={start_method!r} workers get a pickled copy of the data set, not the parent's "
                       "pages: nothing is copied on write")


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity), which DataLoader's own worker warning uses."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@contextlib.contextmanager
def sigchld_held() -> Iterator[None]:
    """Hold DataLoader's SIGCHLD handler off (main thread only) while a loader whose worker died is inspected and
    shut down: the handler raises for a dead worker wherever the main thread happens to be, an error inside the
    cleanup of that very error."""
    if not hasattr(signal, "SIGCHLD") or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    try:
        yield
    finally:
        signal.signal(signal.SIGCHLD, previous)


_JOIN_S = 10.0

# A broken connection (a batch whose worker died before the main process fetched its shared memory) can reach
# the main process a moment before the kernel shows that worker dead: how long to keep looking for it.
BROKEN_CONNECTION_S = 2.0

# Each report is one SIGCHLD that arrived before DataLoader's handler was held off, at most one per worker; more
# than this many in a row is a loop, not a death.
HANDLER_REPORTS = 8


def shut_down(iterator: Iterator[Any] | None) -> None:
    """Stop a DataLoader iterator's workers and wait until each has exited, killing any that does not stop.

    Args:
        iterator: what ``iter(loader)`` returned; None or one without workers is a no-op.
    """
    if iterator is None:
        return
    processes = list(getattr(iterator, "_workers", ()))
    # DataLoader has no public shutdown: its iterator's own (what its __del__ calls) stops and joins the workers,
    # terminating any that does not stop in time.
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is not None:
        with sigchld_held():
            try:
                shutdown()
            except RuntimeError as error:
                # After a worker died, DataLoader's SIGCHLD handler reports it again when another worker exits
                # while being joined (outside the main thread it cannot be held off); the batch that failed has
                # raised that error already.
                if not is_handler_report(error):
                    raise
    for process in processes:
        process.join(timeout=_JOIN_S)
        if process.is_alive():
            process.kill()
            process.join(timeout=_JOIN_S)
    _join_feeders(iterator)


def _join_feeders(iterator: Iterator[Any]) -> None:
    """Wait for the threads that feed the iterator's index queues, which torch's shutdown leaves running.

    DataLoader closes its index queues with ``cancel_join_thread()``: the thread of this process that feeds each
    one may outlive the shutdown, holding the queue's lock and semaphore. Under a spawn or forkserver context those
    are named semaphores that multiprocessing's resource tracker watches, released only when that thread ends. A
    tracker stopped in between (the test suite stops it after the test that started it) unlinks them as "leaked";
    their own cleanup then fails in ``sem_unlink`` (FileNotFoundError), or unlinks first and unregisters with a
    tracker started afresh, which never saw them (``KeyError: '/mp-...'``). Joined here, a closed loader holds none.
    """
    for queue in getattr(iterator, "_index_queues", ()):
        feeder = getattr(queue, "_thread", None)  # multiprocessing.Queue's feeder; None until something is put
        if feeder is not None:
            feeder.join(timeout=_JOIN_S)


def exited(pids: list[int], wait_s: float = 0.0) -> list[int]:
    """The processes among ``pids`` that have exited (or are zombies), looking again for up to ``wait_s`` seconds
    while there is none.

    Args:
        pids: the worker processes to look at.
        wait_s: how long to keep looking (`BROKEN_CONNECTION_S` after a broken connection).

    Returns:
        The pids that are gone, in the order given.
    """
    deadline = time.monotonic() + wait_s
    while True:
        dead = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                    dead.append(pid)
            except psutil.NoSuchProcess:
                dead.append(pid)
        if dead or time.monotonic() >= deadline:
            return dead
        time.sleep(0.05)


def is_handler_report(error: BaseException) -> bool:
    """Whether ``error`` is DataLoader's own report of a dead worker (its SIGCHLD handler's or its iterator's)."""
    return isinstance(error, RuntimeError) and str(error).startswith("DataLoader worker")


class WorkerDied(RuntimeError):
    """A DataLoader worker died while the loader ran; the message names its pid and the error it caused."""



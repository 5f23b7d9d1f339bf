"""Measure a user's DataLoader: its batches' anatomy, throughput per setting against its ceiling, its memory.

Each setting is timed by the loader family's own `steady.steady_state`, one after the other, within the budget
(docs/scan-loader.md).
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psutil
import torch
from torch.utils.data import DataLoader

from pitfalls.families.loader.steady import Steady, prefilled, steady_state
from pitfalls.families.loader.workers import WorkerDied, is_handler_report, shut_down
from pitfalls.probes.anatomy import anatomy
from pitfalls.probes.group_memory import GroupMemorySampler
from pitfalls.result import Unavailable
from pitfalls.scan_loader.advice import advise
from pitfalls.scan_loader.containers import find_containers, touch_copied_bytes
from pitfalls.scan_loader.deliver import Delivery, theirs
from pitfalls.scan_loader.rebuild import DEFAULT_PREFETCH, rebuild, worker_pids
from pitfalls.scan_loader.results import ScanLoaderReport, Setting, SettingResult, WorkerGrowth, verdict
from pitfalls.scan_loader.target import Step
from pitfalls.targets import TargetError

__all__ = ["ScanOptions", "default_workers", "scan_loader"]

ANATOMY_BATCHES = 3
# The ceiling cycles through the anatomy's batches held in RAM.
CEILING_MIN_BATCHES = 10
# A worker's USS is read at rest: after the queue has filled, until two readings agree within this share.
SETTLE_S = 0.3
SETTLE_READINGS = 8
SETTLE_AGREE = 0.01
# A fresh iterator's workers start (fork, import, worker_init_fn) before the first batch: allowed per worker.
WORKER_START_S = 0.5


def default_workers() -> tuple[int, ...]:
    """0, 1, 2, ... up to the usable cores."""
    affinity = getattr(psutil.Process(), "cpu_affinity", None)  # Linux and Windows only
    cores = (len(affinity()) if affinity is not None else 0) or psutil.cpu_count() or 1
    return tuple(range(cores + 1))


@dataclass(frozen=True)
class ScanOptions:
    """How to scan.

    Attributes:
        device: where batches are delivered.
        workers: the num_workers values to time.
        budget_s: seconds the whole scan may take (a batch under way is finished).
        min_seconds: the least a setting is timed (None: from the budget).
        memory_interval_s: the group memory sampler's period during a timed run, longer than the calibration's
            default: reading a process's memory map costs throughput (docs/scan-loader.md).
    """

    device: torch.device = torch.device("cpu")
    workers: tuple[int, ...] = (0, 1, 2)
    budget_s: float = 60.0
    min_seconds: float | None = None
    memory_interval_s: float = 0.05


class _Clock:
    def __init__(self, budget_s: float) -> None:
        self.budget_s = budget_s
        self.began = time.perf_counter()

    @property
    def left(self) -> float:
        return self.budget_s - self.elapsed

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.began


def _started(held: contextlib.ExitStack, target: str, loader: DataLoader[Any]) -> tuple[Iterator[Any], Any]:
    """A loader's iterator (workers start here), registered to be shut down, and its batches as the user's."""
    raw = iter(loader)
    held.callback(shut_down, raw)
    return theirs(target, raw), raw


def _first_batches(held: contextlib.ExitStack, target: str, loader: DataLoader[Any]) -> tuple[list[Any], float]:
    """A few batches at num_workers=0 (the user's errors show here, in this process) and the least s per batch."""
    batches, raw = _started(held, target, rebuild(loader, workers=0))
    got, took = [], []
    for _ in range(ANATOMY_BATCHES):
        began = time.perf_counter()
        batch = next(batches, None)
        if batch is None:
            break
        took.append(time.perf_counter() - began)
        got.append(batch)
    shut_down(raw)
    if not got:
        raise TargetError(f"TARGET {target!r} gives no batch: its loader is empty (a Dataset shorter than "
                          "--batch-size with drop_last?)")
    return got, min(took)


def _settled_uss(pids: list[int]) -> dict[int, int]:
    """Each worker's USS once the workers rest (their queue full), read until two readings agree."""
    last: dict[int, int] = {}
    for _ in range(SETTLE_READINGS):
        time.sleep(SETTLE_S)
        now = {}
        for pid in pids:
            with contextlib.suppress(psutil.NoSuchProcess):
                now[pid] = psutil.Process(pid).memory_full_info().uss
        if last and now.keys() == last.keys() and \
                all(abs(now[p] - last[p]) <= SETTLE_AGREE * max(last[p], 1) for p in now):
            return now
        last = now
    return last


def _copy_on_write(held: contextlib.ExitStack, target: str, loader: DataLoader[Any], workers: int, samples: int,
                   epoch: int | None, clock: _Clock) -> WorkerGrowth | Unavailable:
    """Each worker's USS growth over an epoch of items (or what the budget allows), read at rest at both ends."""
    context = loader.multiprocessing_context
    method = context.get_start_method() if context is not None else torch.multiprocessing.get_start_method()
    if workers == 0:
        return Unavailable("no worker was timed: copy-on-write needs num_workers > 0")
    if method != "fork":
        return Unavailable(f"workers start with {method!r}: each gets a pickled copy of the dataset, not the "
                           "parent's pages, so nothing is copied on write")
    batches, raw = _started(held, target, rebuild(loader, workers=workers))
    for _ in range(workers):  # every worker has started and made a batch
        if next(batches, None) is None:
            shut_down(raw)
            return Unavailable("the epoch ended before every worker had made a batch")
    pids = worker_pids(raw)
    before = _settled_uss(pids)
    wanted = epoch if epoch is not None else 10 * workers
    read = 0
    deadline = time.perf_counter() + max(clock.left, 0.0)
    while read < wanted and time.perf_counter() < deadline:
        if next(batches, None) is None:
            break
        read += 1
    after = _settled_uss(pids)
    shut_down(raw)
    if read == 0:
        return Unavailable("the budget left no time to read items after the workers started")
    growth = tuple(after[p] - before[p] for p in pids if p in before and p in after)
    return WorkerGrowth(workers, growth, read * samples)


def _epoch_starts(held: contextlib.ExitStack, target: str, loader: DataLoader[Any], workers: int,
                  fresh: Steady | None) -> dict[str, float | Unavailable]:
    """Time to the first batch of an epoch with persistent_workers off (a fresh iterator) and on (the next epoch's)."""
    off: float | Unavailable = fresh.first_batch_s if fresh is not None else Unavailable("not timed")
    if workers == 0:
        return {"persistent_workers=off": off, "persistent_workers=on": Unavailable("needs num_workers > 0")}
    persistent = rebuild(loader, workers=workers, persistent_workers=True, cycle=False)
    batches, raw = _started(held, target, persistent)
    on: float | Unavailable = Unavailable("the loader gave no batch")
    if next(batches, None) is not None:
        began = time.perf_counter()
        again = iter(persistent)  # the same workers, told to start the next epoch
        got = next(theirs(target, again), None)
        on = time.perf_counter() - began if got is not None else Unavailable("the next epoch gave no batch")
        shut_down(again)
    shut_down(raw)
    return {"persistent_workers=off": off, "persistent_workers=on": on}


def scan_loader(loader: DataLoader[Any], step: Step | None, options: ScanOptions, *, target: str = "loader",
                step_name: str = "step") -> ScanLoaderReport:
    """Scan a user's DataLoader (and step): anatomy, throughput per setting, ceiling, memory, advice.

    Args:
        loader: the user's DataLoader (not modified: each setting is a new loader over the same dataset).
        step: called with each batch on the device; None for a step of zero cost.
        options: device, worker counts, budget.
        target: how errors and the report name the loader.
        step_name: how errors name the step.

    Returns:
        The `ScanLoaderReport`.

    Raises:
        ScannedCodeError: the user's dataset, collate function or step raised.
        WorkerDied: a worker died; every worker is shut down first.
    """
    try:
        return _scan(loader, step, options, target, step_name)
    except RuntimeError as error:
        # DataLoader's SIGCHLD handler reports a dead worker wherever the main thread is, not only in next().
        if is_handler_report(error):
            raise WorkerDied(str(error).splitlines()[0]) from error
        raise


def _scan(loader: DataLoader[Any], step: Step | None, options: ScanOptions, target: str,
          step_name: str) -> ScanLoaderReport:
    clock = _Clock(options.budget_s)
    deliver = Delivery(options.device, step, step_name)
    prefetch = loader.prefetch_factor or DEFAULT_PREFETCH
    cuda = options.device.type == "cuda"
    settings = [Setting(w, pin) for w in options.workers for pin in ((False, True) if cuda else (False,))]
    min_seconds = options.min_seconds if options.min_seconds is not None else \
        min(2.0, max(0.3, options.budget_s / (4 * (len(settings) + 2))))
    with contextlib.ExitStack() as held:
        first, load_s = _first_batches(held, target, loader)
        shape = anatomy(first)
        samples = shape.samples_per_batch
        ceiling_run = steady_state(lambda: itertools.cycle(first), deliver, lambda _: samples, discard=0,
                                   min_batches=CEILING_MIN_BATCHES, min_seconds=min_seconds,
                                   deadline=time.perf_counter() + max(clock.left, 0.0))
        ceiling: Steady | Unavailable = ceiling_run if ceiling_run.batches else Unavailable(ceiling_run.short)
        step_s = ceiling_run.step_s / ceiling_run.batches if ceiling_run.batches else 0.0
        results = []
        for setting in settings:
            discard = prefilled(setting.workers, prefetch)
            per_batch = max(load_s / max(setting.workers, 1), step_s)
            estimate = setting.workers * WORKER_START_S + max(discard + max(10, 10 * discard), 1) * per_batch
            if estimate > clock.left:
                results.append(SettingResult(setting, None, f"the budget: needs about {estimate:.1f} s, "
                                                            f"{max(clock.left, 0.0):.1f} s left"))
                continue
            rebuilt = rebuild(loader, workers=setting.workers, pin_memory=setting.pin_memory)
            deliver.non_blocking = setting.pin_memory
            raws: list[Any] = []

            def start(rebuilt: DataLoader[Any] = rebuilt, raws: list[Any] = raws) -> Iterator[Any]:
                batches, raw = _started(held, target, rebuilt)
                raws.append(raw)
                return batches

            with GroupMemorySampler(interval_s=options.memory_interval_s) as sampler:
                run = steady_state(start, deliver, lambda _: samples, discard=discard, min_seconds=min_seconds,
                                   deadline=time.perf_counter() + max(clock.left, 0.0))
            for raw in raws:
                shut_down(raw)
            bound = verdict(run, None if isinstance(ceiling, Unavailable) else ceiling.samples_per_second) \
                if run.batches else None
            results.append(SettingResult(setting, run if run.batches else None, run.short if not run.batches else "",
                                         sampler.result, bound))
        deliver.non_blocking = False
        timed = [r for r in results if r.steady is not None and not r.setting.pin_memory]
        # Persistent workers matter only with workers: the fastest setting that has some.
        best = max((r for r in timed if r.setting.workers), key=lambda r: r.steady.samples_per_second
                   if r.steady else 0.0, default=None)
        most = max((r.setting.workers for r in timed), default=0)
        epoch = _length(loader)  # batches in one epoch; None for an iterable dataset
        if best is not None and clock.left > WORKER_START_S * best.setting.workers * 3:
            starts = _epoch_starts(held, target, loader, best.setting.workers, best.steady)
        else:
            why = "no setting with workers was timed" if best is None else "the budget ran out before it"
            starts = {"persistent_workers=off": Unavailable("no setting was timed"),
                      "persistent_workers=on": Unavailable(why)}
        cow: WorkerGrowth | Unavailable = Unavailable("the budget ran out before it")
        if clock.left > WORKER_START_S * most + 2 * SETTLE_S * SETTLE_READINGS or most == 0:
            cow = _copy_on_write(held, target, loader, most, samples, epoch, clock)
        containers = find_containers(loader.dataset)
        copied = touch_copied_bytes(loader.dataset, containers) if containers else {}
    items = _length(loader.dataset)
    report = ScanLoaderReport(target, step_name if step is not None else None, str(options.device), options.budget_s,
                              clock.elapsed, shape, prefetch, epoch, items, ceiling, tuple(results), starts, cow,
                              tuple(containers), copied)
    return advise(report)


def _length(sized: Any) -> int | None:
    """A loader's or a dataset's length, or None when it has none."""
    try:
        return len(sized)
    except TypeError:
        return None

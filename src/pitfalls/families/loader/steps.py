"""One batch per call: the step of a loader variant or of the floor, and how a case's step is made."""

from __future__ import annotations

import itertools
import multiprocessing
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, default_collate

from pitfalls.devices import device_threads, fits, synchronize
from pitfalls.families.loader.data import DataFiles, DataSpec, ensure_data
from pitfalls.families.loader.datasets import decoded_items, make_dataset, uint8_item
from pitfalls.families.loader.device import Consumer, CopyToDevice, DecodeOnDevice, JpegDecoder, torchvision_decoder
from pitfalls.families.loader.stepcost import planted_cost
from pitfalls.families.loader.variants import DEVICE_NORMALIZED, FILE_VARIANTS, JPEG_VARIANTS, RAM_VARIANTS, estimate
from pitfalls.families.loader.workers import (
    BROKEN_CONNECTION_S,
    HANDLER_REPORTS,
    CountingCollate,
    CyclingSampler,
    UssAtBatchStart,
    WorkerBoard,
    WorkerDied,
    WorkerInit,
    exited,
    is_handler_report,
    settle_before_fork,
    shut_down,
    sigchld_held,
    usable_cores,
)
from pitfalls.family import FLOOR, SkipCase
from pitfalls.probes import pagecache

S = TypeVar("S", bound="BatchStep")


def pinned(variant: str, device: torch.device, params: Mapping[str, Any]) -> bool:
    """Whether a case pins its batches: as asked, whatever the rung (an axis of its own; CUDA only)."""
    del variant, device  # one change per rung: no rung switches pinning on
    return bool(params["pin_memory"])


def data_spec(params: Mapping[str, Any]) -> DataSpec:
    return DataSpec(image_size=params["image_size"], items=params["items"], classes=params["classes"],
                    image_format=params["image_format"], source_scale=params["source_scale"], seed=params["seed"])


# What a step does with a batch on the device instead of the model step (a planted cost, a measuring hook).
Consume = Callable[[Tensor, Tensor], Any]
# A data set and its collate function, given instead of the variant's own (a known-answer producer).
Source = tuple[Dataset[Any], Callable[[list[Any]], Any]]


class BatchStep:
    """One call = one batch delivered to the device, then (``model_step``) one SGD step of the `Consumer`.

    Subclasses provide ``next_batch`` (the host batch), ``start`` and ``close``. A ``consume`` given replaces the
    model step: the step then calls it with the delivered batch (images, masks) and returns what it returns.
    """

    def __init__(self, variant: str, device: torch.device, params: Mapping[str, Any], *,
                 consume: Consume | None = None) -> None:
        self.variant = variant
        self.device = device
        self.params = dict(params)
        self.pin = pinned(variant, device, params)
        self.transfer: Callable[[Any], tuple[Tensor, Tensor]] = CopyToDevice(device, self.pin)
        torch.manual_seed(params["seed"])
        self.model = Consumer(params["classes"], variant in DEVICE_NORMALIZED).to(device)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=1e-3, momentum=0.9)
        self.model_step = bool(params["model_step"])
        self.consume = consume
        # The model_ms axis: a planted step cost after the step, so the verdict can place its crossover.
        self.busy = planted_cost(float(params["model_ms"]), device)

    def next_batch(self) -> Any:
        raise NotImplementedError

    def start(self) -> None:
        """Start producing batches (workers start here)."""

    def close(self) -> None:
        """Stop producing batches; release workers."""

    def __enter__(self: S) -> S:
        return self

    def __exit__(self, *_error: object) -> None:
        self.close()

    def pause(self) -> None:
        """Stop producing batches until the next call, which starts afresh (a steady-state block ends here)."""

    @property
    def prefetching_workers(self) -> int:
        """Worker processes that make batches ahead of the consumer (0: batches are made on demand)."""
        return 0

    def worker_pids(self) -> list[int]:
        return []

    def inputs(self) -> tuple[Tensor, Tensor]:
        """The next batch as every variant must deliver it: normalized float32 images, int64 masks, on the device."""
        return self.guarded(lambda: self.model.prepare(*self.transfer(self.next_batch())))

    def deliver(self, batch: Any) -> Any:
        """Copy one host batch (``next_batch``'s) to the device and run the step on it: the ``consume`` given, the
        normalization alone, or the model's SGD step; then the planted ``model_ms`` of busy device time, if any."""
        with device_threads(self.device):
            done = self._step(batch)
        if self.busy is not None:
            self.busy()
        return done

    def _step(self, batch: Any) -> Any:
        if self.consume is not None:
            return self.consume(*self.transfer(batch))
        images, masks = self.transfer(batch)
        if not self.model_step:
            return self.model.prepare(images, masks)
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.model(images, masks)
        loss.backward()
        self.optimizer.step()
        return loss.detach()

    def guarded(self, work: Callable[[], Any]) -> Any:
        """Run ``work`` (a part of a call); a step whose batches come from worker processes names a dead one."""
        return work()

    def __call__(self) -> Any:
        return self.guarded(lambda: self.deliver(self.next_batch()))

    def synced(self) -> None:
        """One call, then a synchronize of the device: the batch's work is done when it returns."""
        self()
        synchronize(self.device)


class LoaderStep(BatchStep):
    """A variant's batches from a DataLoader over its data set.

    Args:
        variant: one of `VARIANTS`.
        device: where batches are delivered.
        params: every parameter of the family, resolved.
        start: start the iterator (and the workers) now; else call `start`.
        measure_uss: have each worker record its USS when it starts (the copy-on-write figure).
        decoder: gpu_decode's JPEG decoder; None means `torchvision_decoder` (SkipCase where it cannot run).
        consume: replaces the model step (see `BatchStep`).
        source: a data set and its collate function instead of the variant's own (a known-answer producer, or the
            calibration's planted memory through this same loader); None means the variant's.
    """

    def __init__(self, variant: str, device: torch.device, params: Mapping[str, Any], *, start: bool = True,
                 measure_uss: bool = False, decoder: JpegDecoder | None = None, consume: Consume | None = None,
                 source: Source | None = None) -> None:
        super().__init__(variant, device, params, consume=consume)
        if variant == "gpu_decode":
            self.transfer = DecodeOnDevice(device, decoder or torchvision_decoder(device), self.pin)
        if source is None:
            files = ensure_data(data_spec(params))
            if params["cache"] == "cold":
                cold_files(files)
            source = make_dataset(variant, files, params["storage"], params["cache"])
        dataset, collate = source
        workers = params["num_workers"]
        context = multiprocessing.get_context(params["start_method"])
        self.board = WorkerBoard(workers, context, measure_uss=measure_uss)
        if measure_uss:
            dataset = UssAtBatchStart(dataset, self.board)
        # Everything of the loader but its data set and sampler: a loader like it (`epochs`) takes the same.
        self.loader_options: dict[str, Any] = {
            "batch_size": params["batch"], "num_workers": workers, "collate_fn": CountingCollate(self.board, collate),
            "pin_memory": self.pin, "drop_last": True}
        if workers:
            self.loader_options |= {"prefetch_factor": params["prefetch_factor"], "timeout": params["timeout"],
                                    "worker_init_fn": WorkerInit(self.board), "multiprocessing_context": context}
        self.loader = DataLoader(dataset, sampler=CyclingSampler(params["items"], params["seed"]),
                                 **self.loader_options)
        self.iterator: Iterator[Any] | None = None
        self.paused = False
        if start:
            self.start()

    def start(self) -> None:
        if self.iterator is None:
            if self.board.measure_uss and self.params["num_workers"]:
                settle_before_fork()  # the workers' copy-on-write is measured: see there
            self.iterator = iter(self.loader)

    @property
    def prefetching_workers(self) -> int:
        return int(self.params["num_workers"])

    def pause(self) -> None:
        """Shut the workers down, as `close` does, but let the next call start a fresh iterator."""
        self.close()
        self.paused = True

    def next_batch(self) -> Any:
        if self.iterator is None and self.paused:
            self.paused = False
            self.start()
        if self.iterator is None:
            raise RuntimeError(f"{self.variant}: the loader was closed (or never started)")
        return next(self.iterator)

    def guarded(self, work: Callable[[], Any]) -> Any:
        """Run ``work``; if it fails because a worker died, close the loader and say which worker.

        A killed worker surfaces in several ways: DataLoader's own "exited unexpectedly", its SIGCHLD handler's
        "killed by signal" (raised wherever the main thread is), or an OSError while taking a batch the dead
        worker still held. Closing at once also stops that handler from raising again later, elsewhere.
        """
        try:
            return work()
        except (RuntimeError, OSError, EOFError) as error:
            dead = self.close_if_dead(wait_s=0.0 if isinstance(error, RuntimeError) else BROKEN_CONNECTION_S)
            if not dead:
                raise
            raise WorkerDied(f"DataLoader worker (pid {', '.join(map(str, dead))}) of {self.variant} died while "
                             f"loading a batch ({type(error).__name__}: {error}); the loader is closed") from error

    def close_if_dead(self, wait_s: float) -> list[int]:
        """Close the loader if a worker has exited (looking for up to ``wait_s`` seconds); returns the dead pids.

        DataLoader's SIGCHLD handler, installed until `sigchld_held` replaces it, may report the same death once
        more on the way in: that report is the death already being handled, so the look is made again.
        """
        for _ in range(HANDLER_REPORTS):
            try:
                with sigchld_held():
                    dead = exited(self.board.worker_pids(), wait_s)
                    if dead:
                        self.close()
                    return dead
            except RuntimeError as late:
                if not is_handler_report(late):
                    raise
        raise RuntimeError(f"{self.variant}: DataLoader kept reporting dead workers while the loader was closed")

    def worker_pids(self) -> list[int]:
        """The pids of the workers that have started (each writes its own when it starts)."""
        return self.board.worker_pids()

    def close(self) -> None:
        """Shut the workers down and wait until every one has exited; none is left behind."""
        self.paused = False
        iterator, self.iterator = self.iterator, None
        shut_down(iterator)


class FloorStep(BatchStep):
    """The floor: batches collated once, in RAM, as uint8 (pinned where they would be), then cycled."""

    def __init__(self, device: torch.device, params: Mapping[str, Any]) -> None:
        super().__init__(FLOOR, device, params)
        images, masks = decoded_items(ensure_data(data_spec(params)))
        size = params["batch"]
        self.batches = []
        for first in range(0, len(images) - size + 1, size):
            batch = default_collate([uint8_item(images[i], masks[i]) for i in range(first, first + size)])
            self.batches.append(tuple(t.pin_memory() for t in batch) if self.pin else tuple(batch))
        self.cycle: Iterator[Any] = itertools.cycle(self.batches)

    def next_batch(self) -> Any:
        return next(self.cycle)


def cold_files(files: DataFiles) -> None:
    """Make a data set's files ready to be read cold: written back (a set generated moments ago is still dirty,
    and dirty pages cannot be dropped), then one dropped and checked with mincore; SkipCase if the drop does not
    take here."""
    paths = sorted(path for path in files.root.rglob("*") if path.is_file())
    pagecache.settle(paths)
    reason = pagecache.cold_unavailable_reason(paths[0])
    if reason is not None:
        raise SkipCase(f"cache='cold': {reason}")


def check_params(variant: str, device: torch.device, params: Mapping[str, Any], *, check_cores: bool = True) -> None:
    """Refuse parameters no case accepts (ValueError) and skip what cannot run here (SkipCase)."""
    if params["items"] < params["batch"]:
        raise ValueError(f"items={params['items']} is fewer than batch={params['batch']}: "
                         "every batch is full (drop_last), so items must be >= batch")
    data_spec(params)  # classes and the rest, with their own messages
    if params["pin_memory"] and device.type != "cuda":
        raise SkipCase(f"pin_memory=True needs a CUDA device; on {device} the DataLoader ignores it")
    if variant in JPEG_VARIANTS and params["image_format"] != "jpeg":
        raise SkipCase(f"{variant} decodes JPEG; this case has image_format='png'")
    if params["storage"] != "list" and variant not in RAM_VARIANTS:
        # The same case as storage='list': measuring it again would only add a duplicate.
        raise SkipCase(f"storage={params['storage']!r} applies to the variants that hold items in RAM "
                       f"({', '.join(sorted(RAM_VARIANTS))}); {variant} does not")
    if params["cache"] == "cold" and variant not in FILE_VARIANTS:
        # Nothing of such a case is read from a file while it runs: the same case as cache='warm'.
        raise SkipCase(f"cache='cold' applies to the rungs that read files ({', '.join(sorted(FILE_VARIANTS))}); "
                       f"{variant} holds its items in RAM")
    workers = params["num_workers"]
    if check_cores and variant != FLOOR and workers > usable_cores():
        raise SkipCase(f"num_workers={workers} is more than the {usable_cores()} usable CPU cores here: its figures "
                       f"would measure oversubscription (estimate for this case: {estimate(params) / 2**30:.1f} GiB)")


def make_step(variant: str, device: torch.device, params: Mapping[str, Any], *, check_cores: bool = True,
              start: bool = True, measure_uss: bool = False, decoder: JpegDecoder | None = None,
              consume: Consume | None = None, source: Source | None = None) -> BatchStep:
    """Build the batch step of a variant or the floor, after `check_params` and a memory check.

    Args:
        variant, device, params, start, measure_uss, decoder, consume, source: as `LoaderStep`'s; ``variant`` may
            also be ``"floor"``.
        check_cores: skip a case with more workers than usable cores (memory figures measure such a case).

    Raises:
        ValueError: parameters no case accepts.
        SkipCase: the case cannot run here; the reason says why.
    """
    check_params(variant, device, params, check_cores=check_cores)
    ok, reason = fits(torch.device("cpu"), estimate(params))
    if not ok:
        raise SkipCase(reason)
    if variant == FLOOR:
        return FloorStep(device, params)
    return LoaderStep(variant, device, params, start=start, measure_uss=measure_uss, decoder=decoder,
                      consume=consume, source=source)


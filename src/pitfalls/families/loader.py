"""Article 001: the DataLoader advice, as a ladder of variants that each add one piece of it.

A segmentation batch (B images 3 x S x S, B masks S x S of C classes) is loaded, delivered to the device and
consumed by a small training step. Every variant delivers the same thing: the normalized float32 image batch and
the int64 mask batch on the device. They differ in where the work is done:

=============== ========================================== ============================= ====================
variant         where an item comes from                   per item on the host           on the device
=============== ========================================== ============================= ====================
naive           disk, ``source_scale`` x larger            read, decode, resize,          -
                                                           normalize to float32, int64
offline         disk, resized once offline (advice 3)      read, decode, normalize       -
ram_encoded     encoded bytes in RAM (advice 1)            decode, normalize             -
ram_decoded     decoded pixels in RAM                      normalize                     -
uint8           decoded pixels in RAM                      nothing: uint8 image and      normalize (a
                                                           uint8 mask (advice 4)         ``Normalize`` module),
                                                                                         mask to int64
gpu_decode      JPEG bytes in RAM                          nothing                       decode (torchvision
                                                                                         ``decode_jpeg``),
                                                                                         normalize
=============== ========================================== ============================= ====================

uint8, gpu_decode and the floor pin their batches and copy them with ``non_blocking`` on a CUDA device (the
``pin_memory`` parameter overrides that). The floor iterates batches that were collated once, in RAM, as uint8:
the job with no loading at all.

One call of a case is one batch: the next batch of a persistent iterator, copied to the device, then one step of
a 1x1-convolution head with cross-entropy and SGD, so that a device starved by its loader shows as idle. The
sampler cycles through seeded epochs without end, so the iterator (and its workers) lives as long as the case
and no epoch boundary stalls the pipeline; ``Case.close`` shuts the workers down.

Workers are DataLoader's own: ``num_workers``, ``prefetch_factor``, ``pin_memory``, ``timeout``,
``multiprocessing_context`` (``start_method``) and a ``worker_init_fn`` that records each worker's pid (and, for the
copy-on-write figure, its memory) in shared memory. A case with more workers than usable CPU cores is skipped with
the reason (its memory figures are still measured), as is one whose estimate does not fit in RAM.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import partial
from typing import Any

import cv2
import numpy as np
import psutil
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset, Sampler, default_collate, get_worker_info

from pitfalls.devices import fits
from pitfalls.families.loader_data import (
    DataFiles,
    DataSpec,
    decode,
    ensure_data,
    read,
    read_bytes,
    resize_image,
    resize_mask,
    single_threaded_opencv,
)
from pitfalls.family import CUDA, FLOOR, NVML, SPEEDUP, TIME, Case, Comparison, Family, OwnFigure, Param, SkipCase

VARIANTS = ("naive", "offline", "ram_encoded", "ram_decoded", "uint8", "gpu_decode")
# The steps that deliver uint8 and normalize on the device; they pin their batches on a CUDA device by default.
DEVICE_NORMALIZED = frozenset({"uint8", "gpu_decode", FLOOR})
RAM_VARIANTS = frozenset({"ram_encoded", "ram_decoded", "uint8", "gpu_decode"})
# ImageNet's mean and std in 0..255, in OpenCV's BGR channel order (the data is synthetic: any fixed pair does).
MEAN = (0.406 * 255, 0.456 * 255, 0.485 * 255)
STD = (0.225 * 255, 0.224 * 255, 0.229 * 255)
# Per worker process in the memory estimate: a forked worker's own heap, queues and buffers.
WORKER_OVERHEAD_BYTES = 128 * 2**20


class Normalize(nn.Module):
    """The article's ``Normalize``: ``(x - mean) / std`` per channel, for uint8 or float input, as a module.

    Args:
        mean: per-channel means, in the input's scale (0..255 for uint8 images).
        std: per-channel standard deviations, same scale.
    """

    mean: Tensor
    std: Tensor

    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean).float().reshape(1, len(mean), 1, 1).contiguous())
        # Stored as its reciprocal, as in the article: one multiplication per pixel instead of a division.
        self.register_buffer("std", torch.tensor(std).float().reshape(1, len(std), 1, 1).reciprocal().contiguous())

    def forward(self, images: Tensor) -> Tensor:
        """Normalize a batch [B, C, H, W] (any dtype) to float32."""
        return (images.to(self.mean.dtype) - self.mean) * self.std


# The host-side normalize of the variants that normalize per item: the same module, so that normalizing on the
# host and on the device differ only in where the arithmetic runs.
_HOST_NORMALIZE = Normalize(MEAN, STD)


def float_item(image: np.ndarray, mask: np.ndarray) -> tuple[Tensor, Tensor]:
    """An item as the host-normalizing variants return it: float32 image [3, S, S], int64 mask [S, S]."""
    chw = torch.from_numpy(image).permute(2, 0, 1)
    return _HOST_NORMALIZE(chw.unsqueeze(0))[0], torch.from_numpy(mask).long()


def uint8_item(image: np.ndarray, mask: np.ndarray) -> tuple[Tensor, Tensor]:
    """An item as the article's advice 4 returns it: uint8 image [3, S, S], uint8 mask [S, S], no arithmetic."""
    return torch.from_numpy(image).permute(2, 0, 1).contiguous(), torch.from_numpy(np.ascontiguousarray(mask))


Emit = Callable[[np.ndarray, np.ndarray], tuple[Tensor, Tensor]]


# --- how the RAM variants hold their items ----------------------------------------------------------------------


class ListStore:
    """The article's form: a Python list with one object per item (``bytes`` or an array).

    In a forked worker, reading an item increments the object's reference count, which writes to the page
    holding it: the page is copied into the worker (copy-on-write), one page or more per item read.
    """

    def __init__(self, items: list[Any]) -> None:
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> Any:
        return self.items[index]

    @property
    def nbytes(self) -> int:
        return sum(len(item) if isinstance(item, bytes) else item.nbytes for item in self.items)


class PackedBytes:
    """Variable-length items in one uint8 buffer with an offsets array: two objects, whatever the item count."""

    def __init__(self, items: Sequence[bytes]) -> None:
        sizes = np.fromiter((len(item) for item in items), dtype=np.int64, count=len(items))
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.buffer = np.frombuffer(b"".join(items), dtype=np.uint8)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, index: int) -> np.ndarray:
        return self.buffer[self.offsets[index]:self.offsets[index + 1]]

    @property
    def nbytes(self) -> int:
        return int(self.buffer.nbytes + self.offsets.nbytes)


class PackedArrays:
    """Same-shape items in one array [N, ...]."""

    def __init__(self, items: Sequence[np.ndarray]) -> None:
        self.array = np.stack(items)

    def __len__(self) -> int:
        return len(self.array)

    def __getitem__(self, index: int) -> np.ndarray:
        return self.array[index]

    @property
    def nbytes(self) -> int:
        return int(self.array.nbytes)


Store = ListStore | PackedBytes | PackedArrays


def make_store(items: list[Any], storage: str) -> Store:
    """Hold items as a Python list (``storage="list"``) or packed into one buffer (``"packed"``)."""
    if storage == "list":
        return ListStore(items)
    if storage != "packed":
        raise ValueError(f"storage={storage!r} is not allowed; allowed: list, packed")
    return PackedBytes(items) if items and isinstance(items[0], bytes) else PackedArrays(items)


# --- data sets: one per rung of the ladder ----------------------------------------------------------------------


class SegmentationItems(Dataset[Any]):
    """Items of the synthetic set; subclasses say where an item comes from (``load``), ``emit`` what it becomes."""

    def __init__(self, files: DataFiles, emit: Emit) -> None:
        self.files = files
        self.emit = emit
        size = files.spec.image_size
        self.image_shape = (size, size, 3)
        self.mask_shape = (size, size)

    def __len__(self) -> int:
        return self.files.spec.items

    def load(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def __getitem__(self, index: int) -> Any:
        return self.emit(*self.load(index))


class SourceFiles(SegmentationItems):
    """naive: the large source files, read, decoded and resized on every access."""

    def load(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        spec, size = self.files.spec, self.files.spec.image_size
        big = spec.source_size
        image = read(self.files.source_image(index), index, cv2.IMREAD_COLOR, (big, big, 3))
        mask = read(self.files.source_mask(index), index, cv2.IMREAD_GRAYSCALE, (big, big))
        return resize_image(image, size), resize_mask(mask, size)


class OfflineFiles(SegmentationItems):
    """offline: files resized once, offline; still read and decoded on every access."""

    def load(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        image = read(self.files.image(index), index, cv2.IMREAD_COLOR, self.image_shape)
        return image, read(self.files.mask(index), index, cv2.IMREAD_GRAYSCALE, self.mask_shape)


class EncodedInRam(SegmentationItems):
    """ram_encoded: the files' bytes held in RAM and decoded on every access (the article's own data set)."""

    def __init__(self, files: DataFiles, emit: Emit, storage: str) -> None:
        super().__init__(files, emit)
        count = files.spec.items
        self.images = make_store([read_bytes(files.image(i), i) for i in range(count)], storage)
        self.masks = make_store([read_bytes(files.mask(i), i) for i in range(count)], storage)

    def load(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        where = f"the encoded bytes of {self.files.image(index).name}"
        image = decode(self.images[index], index, where, cv2.IMREAD_COLOR, self.image_shape)
        mask = decode(self.masks[index], index, f"the encoded bytes of {self.files.mask(index).name}",
                      cv2.IMREAD_GRAYSCALE, self.mask_shape)
        return image, mask


def decoded_items(files: DataFiles) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Every offline image and mask, decoded: what the decoded RAM forms hold."""
    spec = files.spec
    shape = (spec.image_size, spec.image_size)
    images = [read(files.image(i), i, cv2.IMREAD_COLOR, (*shape, 3)) for i in range(spec.items)]
    masks = [read(files.mask(i), i, cv2.IMREAD_GRAYSCALE, shape) for i in range(spec.items)]
    return images, masks


class DecodedInRam(SegmentationItems):
    """ram_decoded and uint8: decoded pixels held in RAM."""

    def __init__(self, files: DataFiles, emit: Emit, storage: str) -> None:
        super().__init__(files, emit)
        images, masks = decoded_items(files)
        self.images, self.masks = make_store(images, storage), make_store(masks, storage)

    def load(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        return self.images[index], self.masks[index]


class JpegInRam(Dataset[Any]):
    """gpu_decode: each item is its JPEG's bytes, undecoded, and its decoded uint8 mask."""

    def __init__(self, files: DataFiles, storage: str) -> None:
        self.files = files
        count = files.spec.items
        self.images = make_store([read_bytes(files.image(i), i) for i in range(count)], storage)
        self.masks = make_store(decoded_items(files)[1], storage)

    def __len__(self) -> int:
        return self.files.spec.items

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        data = self.images[index]
        encoded = np.frombuffer(data, dtype=np.uint8) if isinstance(data, bytes) else data
        return torch.from_numpy(encoded.copy()), torch.from_numpy(np.ascontiguousarray(self.masks[index]))


def collate_encoded(items: list[tuple[Tensor, Tensor]]) -> tuple[list[Tensor], Tensor]:
    """Encoded images differ in length: keep them as a list; stack the masks."""
    return [image for image, _ in items], torch.stack([mask for _, mask in items])


# --- DataLoader machinery ---------------------------------------------------------------------------------------


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


def uss_without_batches() -> int:
    """This process's USS less the pages of torch's shared-memory segments it maps (the batches it is handing
    over), which move from one process's USS to shared as soon as the main process maps them."""
    maps = psutil.Process().memory_maps(grouped=True)
    return sum(m.private_clean + m.private_dirty for m in maps if "/torch_" not in m.path)


class WorkerBoard:
    """Per-worker slots in shared memory that the workers write: pid, batches made and, when asked, their USS.

    Created from the loader's multiprocessing context, without locks: each worker writes only its own slot. With
    ``measure_uss`` a worker records its USS (`uss_without_batches`) when it starts, and at the start of every
    batch, before it loads an item, after returning its free heap (`release_free_heap`): the second batch's value
    is the reference, the latest the current value, so the growth between them is measured at the same point of
    the worker's cycle, without the batches it is handing over.
    """

    def __init__(self, workers: int, context: Any, *, measure_uss: bool = False) -> None:
        slots = max(workers, 1)
        self.pids = context.RawArray("q", slots)
        self.batches = context.RawArray("q", slots)
        self.batches_started = context.RawArray("q", slots)
        self.uss_at_start = context.RawArray("d", slots)
        self.uss_reference = context.RawArray("d", slots)
        self.uss_latest = context.RawArray("d", slots)
        self.measure_uss = measure_uss

    def started(self, worker_id: int) -> None:
        if self.measure_uss:
            self.uss_at_start[worker_id] = float(uss_without_batches())
        self.pids[worker_id] = os.getpid()

    def batch_starting(self, worker_id: int) -> None:
        self.batches_started[worker_id] += 1
        release_free_heap()
        uss = float(uss_without_batches())
        if self.batches_started[worker_id] == 2:
            self.uss_reference[worker_id] = uss
        self.uss_latest[worker_id] = uss

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
    """

    def __init__(self, board: WorkerBoard) -> None:
        self.board = board

    def __call__(self, worker_id: int) -> None:
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


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity), which DataLoader's own worker warning uses."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def pinned(variant: str, device: torch.device, params: Mapping[str, Any]) -> bool:
    """Whether a case pins its batches: as asked, else where the ladder's step does it and a GPU exists."""
    choice = params["pin_memory"]
    return bool(variant in DEVICE_NORMALIZED and device.type == "cuda") if choice is None else bool(choice)


def data_spec(params: Mapping[str, Any]) -> DataSpec:
    return DataSpec(image_size=params["image_size"], items=params["items"], classes=params["classes"],
                    image_format=params["image_format"], source_scale=params["source_scale"], seed=params["seed"])


# --- the device side --------------------------------------------------------------------------------------------


class Consumer(nn.Module):
    """The small model that consumes each batch: (normalize,) a 1x1 convolution to C classes, cross-entropy.

    Args:
        classes: C.
        normalize_on_device: put the article's ``Normalize`` in front (the uint8 variants); else the images
            arrive normalized.
    """

    def __init__(self, classes: int, normalize_on_device: bool) -> None:
        super().__init__()
        self.normalize: nn.Module = Normalize(MEAN, STD) if normalize_on_device else nn.Identity()
        self.head = nn.Conv2d(3, classes, 1)

    def prepare(self, images: Tensor, masks: Tensor) -> tuple[Tensor, Tensor]:
        """What every variant must deliver: normalized float32 images and int64 masks, on the device."""
        return self.normalize(images), masks.long()

    def forward(self, images: Tensor, masks: Tensor) -> Tensor:
        images, masks = self.prepare(images, masks)
        return F.cross_entropy(self.head(images), masks)


class CopyToDevice:
    """Copy a host batch (images, masks) to the device; ``non_blocking`` where the batch is pinned."""

    def __init__(self, device: torch.device, non_blocking: bool) -> None:
        self.device = device
        self.non_blocking = non_blocking

    def __call__(self, batch: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        images, masks = batch
        return (images.to(self.device, non_blocking=self.non_blocking),
                masks.to(self.device, non_blocking=self.non_blocking))


JpegDecoder = Callable[[list[Tensor]], list[Tensor]]


class DecodeOnDevice:
    """gpu_decode: decode a batch of JPEG bytes on the device, then copy the masks.

    Args:
        device: where the images are decoded.
        decoder: encoded uint8 tensors -> decoded RGB uint8 images [3, S, S] on ``device``
            (`torchvision_decoder`; a test may give another).
        non_blocking: copy the masks with ``non_blocking``.
    """

    def __init__(self, device: torch.device, decoder: JpegDecoder, non_blocking: bool) -> None:
        self.device = device
        self.decoder = decoder
        self.non_blocking = non_blocking

    def __call__(self, batch: tuple[list[Tensor], Tensor]) -> tuple[Tensor, Tensor]:
        encoded, masks = batch
        images = torch.stack(self.decoder(list(encoded)))
        # torchvision decodes to RGB; the other variants keep OpenCV's BGR.
        return images.flip(1), masks.to(self.device, non_blocking=self.non_blocking)


def torchvision_decoder(device: torch.device) -> JpegDecoder:
    """``torchvision.io.decode_jpeg`` on ``device`` for a list of JPEGs, or SkipCase saying what is missing."""
    missing = []
    if device.type != "cuda":
        missing.append(f"a CUDA device (this case runs on {device})")
    try:
        from torchvision.io import ImageReadMode, decode_jpeg
    except ImportError as error:
        missing.append(f"torchvision ({type(error).__name__}: {error})")
    if missing:
        raise SkipCase("gpu_decode decodes JPEG with torchvision.io.decode_jpeg(device='cuda'); it needs "
                       + " and ".join(missing))
    return partial(decode_jpeg, mode=ImageReadMode.RGB, device=device)


def opencv_decoder(device: torch.device) -> JpegDecoder:
    """A stand-in for `torchvision_decoder` with the same contract, decoding on the host with OpenCV: it checks
    everything of gpu_decode but the device's decoder where that cannot run."""

    def decode_all(encoded: list[Tensor]) -> list[Tensor]:
        images = [decode(t.numpy(), i, "a JPEG of the batch", cv2.IMREAD_COLOR) for i, t in enumerate(encoded)]
        return [torch.from_numpy(np.ascontiguousarray(bgr[..., ::-1])).permute(2, 0, 1).to(device) for bgr in images]

    return decode_all


# --- one batch per call -----------------------------------------------------------------------------------------


class BatchStep:
    """One call = one batch delivered to the device, then (``model_step``) one SGD step of the `Consumer`.

    Subclasses provide ``next_batch`` (the host batch), ``start`` and ``close``.
    """

    def __init__(self, variant: str, device: torch.device, params: Mapping[str, Any]) -> None:
        self.variant = variant
        self.device = device
        self.params = dict(params)
        self.pin = pinned(variant, device, params)
        self.transfer: Callable[[Any], tuple[Tensor, Tensor]] = CopyToDevice(device, self.pin)
        torch.manual_seed(params["seed"])
        self.model = Consumer(params["classes"], variant in DEVICE_NORMALIZED).to(device)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=1e-3, momentum=0.9)
        self.model_step = bool(params["model_step"])

    def next_batch(self) -> Any:
        raise NotImplementedError

    def start(self) -> None:
        """Start producing batches (workers start here)."""

    def close(self) -> None:
        """Stop producing batches; release workers."""

    def worker_pids(self) -> list[int]:
        return []

    def inputs(self) -> tuple[Tensor, Tensor]:
        """The next batch as every variant must deliver it: normalized float32 images, int64 masks, on the device."""
        return self.model.prepare(*self.transfer(self.next_batch()))

    def __call__(self) -> Tensor | tuple[Tensor, Tensor]:
        if not self.model_step:
            return self.inputs()
        images, masks = self.transfer(self.next_batch())
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.model(images, masks)
        loss.backward()
        self.optimizer.step()
        return loss.detach()


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


class WorkerDied(RuntimeError):
    """A DataLoader worker died while the loader ran; the message names its pid and the error it caused."""


class LoaderStep(BatchStep):
    """A variant's batches from a DataLoader over its data set.

    Args:
        variant: one of `VARIANTS`.
        device: where batches are delivered.
        params: every parameter of the family, resolved.
        start: start the iterator (and the workers) now; else call `start`.
        measure_uss: have each worker record its USS when it starts (the copy-on-write figure).
        decoder: gpu_decode's JPEG decoder; None means `torchvision_decoder` (SkipCase where it cannot run).
    """

    def __init__(self, variant: str, device: torch.device, params: Mapping[str, Any], *, start: bool = True,
                 measure_uss: bool = False, decoder: JpegDecoder | None = None) -> None:
        super().__init__(variant, device, params)
        if variant == "gpu_decode":
            self.transfer = DecodeOnDevice(device, decoder or torchvision_decoder(device), self.pin)
        files = ensure_data(data_spec(params))
        dataset, collate = make_dataset(variant, files, params["storage"])
        workers = params["num_workers"]
        context = multiprocessing.get_context(params["start_method"])
        self.board = WorkerBoard(workers, context, measure_uss=measure_uss)
        if measure_uss:
            dataset = UssAtBatchStart(dataset, self.board)
        options: dict[str, Any] = {}
        if workers:
            options = {"prefetch_factor": params["prefetch_factor"], "timeout": params["timeout"],
                       "worker_init_fn": WorkerInit(self.board), "multiprocessing_context": context}
        self.loader = DataLoader(dataset, batch_size=params["batch"],
                                 sampler=CyclingSampler(params["items"], params["seed"]), num_workers=workers,
                                 collate_fn=CountingCollate(self.board, collate), pin_memory=self.pin,
                                 drop_last=True, **options)
        self.iterator: Iterator[Any] | None = None
        if start:
            self.start()

    def start(self) -> None:
        if self.iterator is None:
            self.iterator = iter(self.loader)

    def next_batch(self) -> Any:
        if self.iterator is None:
            raise RuntimeError(f"{self.variant}: the loader was closed (or never started)")
        return next(self.iterator)

    def __call__(self) -> Tensor | tuple[Tensor, Tensor]:
        return self.guarded(super().__call__)

    def inputs(self) -> tuple[Tensor, Tensor]:
        return self.guarded(super().inputs)

    def guarded(self, work: Callable[[], Any]) -> Any:
        """Run ``work``; if it fails because a worker died, close the loader and say which worker.

        A killed worker surfaces in several ways: DataLoader's own "exited unexpectedly", its SIGCHLD handler's
        "killed by signal" (raised wherever the main thread is), or an OSError while taking a batch the dead
        worker still held. Closing at once also stops that handler from raising again later, elsewhere.
        """
        try:
            return work()
        except (RuntimeError, OSError, EOFError) as error:
            with sigchld_held():
                # A broken connection can reach the main process a moment before the kernel shows its worker dead.
                dead = self.dead_workers(wait_s=0.0 if isinstance(error, RuntimeError) else 2.0)
                if dead:
                    self.close()
            if not dead:
                raise
            raise WorkerDied(f"DataLoader worker (pid {', '.join(map(str, dead))}) of {self.variant} died while "
                             f"loading a batch ({type(error).__name__}: {error}); the loader is closed") from error

    def dead_workers(self, wait_s: float = 0.0) -> list[int]:
        """The workers that have exited (or are zombies) although the loader still runs, looking again for up to
        ``wait_s`` seconds while there is none."""
        deadline = time.monotonic() + wait_s
        while True:
            dead = []
            for pid in self.board.worker_pids():
                try:
                    if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                        dead.append(pid)
                except psutil.NoSuchProcess:
                    dead.append(pid)
            if dead or time.monotonic() >= deadline:
                return dead
            time.sleep(0.05)

    def worker_pids(self) -> list[int]:
        """The pids of the workers that have started (each writes its own when it starts)."""
        return self.board.worker_pids()

    def close(self) -> None:
        """Shut the workers down and wait until every one has exited; none is left behind."""
        iterator, self.iterator = self.iterator, None
        if iterator is None:
            return
        processes = [w for w in getattr(iterator, "_workers", ())]
        # DataLoader has no public shutdown: its iterator's own (what its __del__ calls) stops and joins the
        # workers, terminating any that does not stop in time.
        shutdown = getattr(iterator, "_shutdown_workers", None)
        if shutdown is not None:
            with sigchld_held():
                try:
                    shutdown()
                except RuntimeError as error:
                    # After a worker died, DataLoader's SIGCHLD handler reports it again when another worker
                    # exits while being joined (outside the main thread it cannot be held off); the batch that
                    # failed has raised that error already.
                    if not str(error).startswith("DataLoader worker"):
                        raise
        del iterator
        for process in processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
                process.join(timeout=10)


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


def make_dataset(variant: str, files: DataFiles, storage: str) -> tuple[Dataset[Any], Callable[[list[Any]], Any]]:
    """A variant's data set and collate function."""
    if variant == "naive":
        return SourceFiles(files, float_item), default_collate
    if variant == "offline":
        return OfflineFiles(files, float_item), default_collate
    if variant == "ram_encoded":
        return EncodedInRam(files, float_item, storage), default_collate
    if variant == "ram_decoded":
        return DecodedInRam(files, float_item, storage), default_collate
    if variant == "uint8":
        return DecodedInRam(files, uint8_item, storage), default_collate
    if variant == "gpu_decode":
        return JpegInRam(files, storage), collate_encoded
    raise ValueError(f"loader variant={variant!r} is not known; allowed: {', '.join(VARIANTS)}")


def check_params(variant: str, device: torch.device, params: Mapping[str, Any], *, check_cores: bool = True) -> None:
    """Refuse parameters no case accepts (ValueError) and skip what cannot run here (SkipCase)."""
    if params["items"] < params["batch"]:
        raise ValueError(f"items={params['items']} is fewer than batch={params['batch']}: "
                         "every batch is full (drop_last), so items must be >= batch")
    data_spec(params)  # classes and the rest, with their own messages
    if params["pin_memory"] and device.type != "cuda":
        raise SkipCase(f"pin_memory=True needs a CUDA device; on {device} the DataLoader ignores it")
    if variant == "gpu_decode" and params["image_format"] != "jpeg":
        raise SkipCase("gpu_decode decodes JPEG; this case has image_format='png'")
    if params["storage"] != "list" and variant not in RAM_VARIANTS:
        # The same case as storage='list': measuring it again would only add a duplicate.
        raise SkipCase(f"storage={params['storage']!r} applies to the variants that hold items in RAM "
                       f"({', '.join(sorted(RAM_VARIANTS))}); {variant} does not")
    workers = params["num_workers"]
    if check_cores and variant != FLOOR and workers > usable_cores():
        raise SkipCase(f"num_workers={workers} is more than the {usable_cores()} usable CPU cores here: its figures "
                       f"would measure oversubscription (estimate for this case: {estimate(params) / 2**30:.1f} GiB)")


def make_step(variant: str, device: torch.device, params: Mapping[str, Any], *, check_cores: bool = True,
              start: bool = True, measure_uss: bool = False, decoder: JpegDecoder | None = None) -> BatchStep:
    """Build the batch step of a variant or the floor, after `check_params` and a memory check.

    Args:
        variant: one of `VARIANTS` or ``"floor"``.
        device: where batches are delivered.
        params: every parameter of the family, resolved.
        check_cores: skip a case with more workers than usable cores (memory figures measure such a case).
        start: start the iterator and the workers now.
        measure_uss: workers record their USS when they start.
        decoder: gpu_decode's JPEG decoder (see `LoaderStep`).

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
    return LoaderStep(variant, device, params, start=start, measure_uss=measure_uss, decoder=decoder)


def build(variant: str, device: torch.device, compiled: bool, params: dict[str, Any]) -> Case:
    """One batch per call of a variant (or the floor) as a case; ``close`` shuts its workers down."""
    step = make_step(variant, device, params)
    return Case(FAMILY.name, variant, device, compiled, params, step, close=step.close)


# --- sizes ------------------------------------------------------------------------------------------------------


def batch_bytes(variant: str, batch: int, image_size: int) -> int:
    """Bytes of one host batch as a variant ships it (gpu_decode: its decoded size, an upper bound)."""
    pixels = batch * image_size * image_size
    if variant in DEVICE_NORMALIZED:
        return pixels * (3 + 1)  # uint8 image, uint8 mask
    return pixels * (3 * 4 + 8)  # float32 image, int64 mask


def nbytes(batch: Any) -> int:
    """Bytes of the tensors of a batch, exactly (lists and tuples of tensors)."""
    if isinstance(batch, Tensor):
        return batch.nelement() * batch.element_size()
    return sum(nbytes(part) for part in batch)


def estimate(params: Mapping[str, Any]) -> int:
    """Peak host bytes of a case, before anything is allocated: the data in RAM, the batches in flight and being
    made, the model step, and each worker's own overhead (the largest variant's figures, whichever it is)."""
    size, batch, workers = params["image_size"], params["batch"], params["num_workers"]
    pixels = size * size
    data = params["items"] * pixels * 4  # decoded uint8 image + mask per item (encoded is smaller)
    host_batch = batch_bytes("naive", batch, size)
    in_flight = (workers * params["prefetch_factor"] + 2) * host_batch
    # Each producer decodes one source item at a time and holds one batch of items before collating it.
    making = max(workers, 1) * (host_batch + 4 * pixels * params["source_scale"] ** 2)
    step = batch * pixels * (3 * 4 * 2 + 8 + params["classes"] * 4 * 3)
    return data + in_flight + making + step + workers * WORKER_OVERHEAD_BYTES


# --- equivalence ------------------------------------------------------------------------------------------------

# JPEG: the offline files went through the encoder once more than the naive variant's, so pixels differ. Measured
# at quality 90 (mean |difference| over 8 items): 7.7 grey levels at 32x32 (the smoke size: its 8 colour cells
# span a few JPEG blocks each), 3.5 at 64x64, 1.8 at 512x512; a swapped channel order gives about 50, another
# item more. Allowed on average, in normalized units (grey levels divided by the smallest std):
JPEG_MEAN_ABS_LEVELS = 10.0
JPEG_MEAN_ABS_TOLERANCE = JPEG_MEAN_ABS_LEVELS / min(STD)
# PNG: bit-exact on the CPU; on a GPU the normalize may round differently from the host's.
PNG_ABS_TOLERANCE = 1e-5
COMPARED_BATCHES = 2


def delivered(variant: str, device: torch.device, params: Mapping[str, Any], batches: int = COMPARED_BATCHES,
              decoder: JpegDecoder | None = None) -> list[tuple[Tensor, Tensor]]:
    """The first ``batches`` batches a variant delivers to the device (normalized images, int64 masks)."""
    step = make_step(variant, device, params, decoder=decoder)
    try:
        return [step.inputs() for _ in range(batches)]
    finally:
        step.close()


def differences(got: list[tuple[Tensor, Tensor]], want: list[tuple[Tensor, Tensor]]) -> tuple[float, float, bool]:
    """(max |image difference|, mean |image difference|, masks equal) between two delivered sequences."""
    worst, total, count, masks_equal = 0.0, 0.0, 0, True
    for (images, masks), (want_images, want_masks) in zip(got, want, strict=True):
        if images.shape != want_images.shape or images.dtype != want_images.dtype or masks.dtype != want_masks.dtype:
            return float("inf"), float("inf"), False
        diff = (images.double() - want_images.double()).abs()
        worst = max(worst, float(diff.max()))
        total += float(diff.sum())
        count += diff.numel()
        masks_equal = masks_equal and torch.equal(masks, want_masks)
    return worst, total / max(count, 1), masks_equal


def compare(family: Family, variant: str, device: torch.device) -> Comparison:
    """Compare what a variant delivers to the device with what ``naive`` delivers, on PNG and JPEG smoke sets.

    PNG must agree within float rounding (bit-exact on the CPU); JPEG within `JPEG_MEAN_ABS_TOLERANCE` on
    average; masks exactly. What cannot run here is named in the detail, as is every failure: gpu_decode runs on
    JPEG only, and where its device decoder cannot run (no CUDA, no torchvision) everything but that decoder is
    checked, with OpenCV decoding the JPEG bytes it ships. The max abs diff reported is PNG's where PNG ran (the
    exact comparison), else JPEG's.
    """
    failed, notes, ran = [], [], 0
    worst: dict[str, float] = {}
    for image_format in ("png", "jpeg"):
        params = family.resolve({**family.smoke, "image_format": image_format})
        try:
            got = delivered(variant, device, params)
        except SkipCase as skip:
            if variant != "gpu_decode" or image_format != "jpeg":
                notes.append(f"{image_format} not run: {skip.reason}")
                continue
            notes.append(f"device decoder not run ({skip.reason}): its JPEG bytes decoded by OpenCV instead")
            got = delivered(variant, device, params, decoder=opencv_decoder(device))
        ran += 1
        max_diff, mean_diff, masks_equal = differences(got, delivered(family.baseline, device, params))
        worst[image_format] = max_diff
        if not masks_equal:
            failed.append(f"{image_format}: masks differ")
        elif image_format == "png" and max_diff > PNG_ABS_TOLERANCE:
            failed.append(f"png: images differ by up to {max_diff:.3g}")
        elif image_format == "jpeg" and mean_diff > JPEG_MEAN_ABS_TOLERANCE:
            failed.append(f"jpeg: images differ by {mean_diff:.3g} on average (allowed {JPEG_MEAN_ABS_TOLERANCE:.3g})")
    if not ran:
        failed.append("no format could run here")
    detail = "; ".join(failed + notes)
    reported = worst.get("png", worst.get("jpeg", float("inf")))
    return Comparison(family.name, variant, str(device), not failed, reported, detail)


def own_figures(case: Case) -> list[OwnFigure]:
    """The family's own figures of a built case (samples/s, bytes per batch, memory...): see `loader_probes`."""
    from pitfalls.families import loader_probes  # it builds on this module

    return loader_probes.own_figures(case)


FAMILY = Family(
    name="loader",
    article="001",
    summary="DataLoader: disk, resize, host normalize and int64 masks vs data in RAM, uint8, normalize on the device",
    variants=VARIANTS,
    params=(
        Param("num_workers", 0, "DataLoader worker processes (0: load in the main process)", minimum=0),
        Param("pin_memory", None, "pin batches and copy them non_blocking; default: on for uint8, gpu_decode and "
              "the floor on a CUDA device, off otherwise", kind=bool),
        Param("image_size", 512, "S: images 3 x S x S, masks S x S", minimum=8),
        Param("batch", 32, "items per batch"),
        Param("image_format", "png", "how images are encoded (masks are always PNG)", choices=("png", "jpeg")),
        Param("storage", "list", "how the RAM variants hold items: a Python list of per-item objects (the "
              "article's) or one packed buffer with offsets", choices=("list", "packed")),
        Param("items", 64, "items in the data set (an epoch); at least batch"),
        Param("classes", 4, "mask labels C, 2..255 (masks are uint8)", minimum=2),
        Param("prefetch_factor", 2, "batches each worker loads ahead (DataLoader's default is 2)"),
        Param("start_method", "fork", "how workers start (DataLoader's multiprocessing_context)",
              choices=("fork", "forkserver", "spawn")),
        Param("timeout", 120, "seconds to wait for a batch from the workers before failing (0: forever)", minimum=0),
        Param("model_step", True, "train the 1x1-conv head on each batch (false: deliver the batch only)"),
        Param("source_scale", 2, "the naive variant's files are this many times the training size on a side"),
        Param("seed", 0, "seed of the data set, the epochs' order and the model", minimum=0),
    ),
    builder=build,
    estimate=estimate,
    comparer=compare,
    smoke={"image_size": 32, "batch": 4, "items": 8},
    grids={
        # Small enough for a shared 2-core CPU: every variant with and without workers, the article's form.
        "quick": {"num_workers": (0, 2), "image_size": (128,), "batch": (32,), "image_format": ("png",),
                  "storage": ("list",)},
        # The article's 512x512 batches of 32, and its 8 workers.
        "full": {"num_workers": (0, 1, 2, 4, 8), "image_size": (128, 256, 512), "batch": (32,),
                 "image_format": ("png", "jpeg"), "storage": ("list", "packed")},
    },
    article_sizes=({"image_size": 512, "batch": 32, "num_workers": 8, "image_format": "jpeg"},),
    figures=frozenset({TIME, SPEEDUP, CUDA, NVML}),
    unit="batch",
    own_figures=own_figures,
)

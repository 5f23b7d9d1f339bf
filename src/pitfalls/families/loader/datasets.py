"""The data sets, one per rung of the ladder, and what an item becomes on the host."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset, default_collate

from pitfalls.families.loader.data import DataFiles, decode, read, read_bytes, resize_image, resize_mask
from pitfalls.families.loader.device import MEAN, STD, Normalize
from pitfalls.families.loader.stores import make_store
from pitfalls.families.loader.variants import VARIANTS
from pitfalls.probes import pagecache

# The host-side normalize of the variants that normalize per item: the device's module, so that normalizing on the
# host and on the device differ only in where the arithmetic runs.
_HOST_NORMALIZE = Normalize(MEAN, STD)


def float_item(image: np.ndarray, mask: np.ndarray) -> tuple[Tensor, Tensor]:
    """An item as the host-normalizing variants return it: float32 image [3, S, S], int64 mask [S, S]."""
    chw = torch.from_numpy(image).permute(2, 0, 1)
    return _HOST_NORMALIZE(chw.unsqueeze(0))[0], torch.from_numpy(mask).long()


def uint8_item(image: np.ndarray, mask: np.ndarray) -> tuple[Tensor, Tensor]:
    """An item as the article's advice 4 returns it: uint8 image [3, S, S], uint8 mask [S, S], no arithmetic.

    The one host work left is the HWC -> CHW transpose, a uint8 copy of the image (a quarter of the bytes the
    float32 rungs write per item); the device side receives channels first, as the article's ``Normalize`` does.
    """
    return torch.from_numpy(image).permute(2, 0, 1).contiguous(), torch.from_numpy(np.ascontiguousarray(mask))


Emit = Callable[[np.ndarray, np.ndarray], tuple[Tensor, Tensor]]


class SegmentationItems(Dataset[Any]):
    """Items of the synthetic set; subclasses say where an item comes from (``load``), ``emit`` what it becomes.

    Args:
        files: the data set's files.
        emit: what an item becomes (`float_item`, `uint8_item`).
        cold: the rungs that read files drop each one from the page cache just before reading it
            (`pitfalls.probes.pagecache.drop`), so it comes from the disk; else it comes from the page cache.
    """

    def __init__(self, files: DataFiles, emit: Emit, cold: bool = False) -> None:
        self.files = files
        self.emit = emit
        self.cold = cold
        size = files.spec.image_size
        self.image_shape = (size, size, 3)
        self.mask_shape = (size, size)

    def read(self, path: Path, index: int, flags: int, shape: tuple[int, ...]) -> np.ndarray:
        """Read and decode one file of item ``index``, from the disk when the data set is cold."""
        if self.cold:
            with contextlib.suppress(FileNotFoundError):  # `read` names the missing file and its item
                pagecache.drop(path)
        return read(path, index, flags, shape)

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
        image = self.read(self.files.source_image(index), index, cv2.IMREAD_COLOR, (big, big, 3))
        mask = self.read(self.files.source_mask(index), index, cv2.IMREAD_GRAYSCALE, (big, big))
        return resize_image(image, size), resize_mask(mask, size)


class OfflineFiles(SegmentationItems):
    """offline: files resized once, offline; still read and decoded on every access."""

    def load(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        image = self.read(self.files.image(index), index, cv2.IMREAD_COLOR, self.image_shape)
        return image, self.read(self.files.mask(index), index, cv2.IMREAD_GRAYSCALE, self.mask_shape)


class EncodedInRam(SegmentationItems):
    """ram_encoded: the files' bytes held in RAM and decoded on every access (the article's own data set)."""

    def __init__(self, files: DataFiles, emit: Emit, storage: str) -> None:
        super().__init__(files, emit)
        self.images = make_store(encoded_items(files, files.image), storage)
        self.masks = make_store(encoded_items(files, files.mask), storage)

    def load(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        where = f"the encoded bytes of {self.files.image(index).name}"
        image = decode(self.images[index], index, where, cv2.IMREAD_COLOR, self.image_shape)
        mask = decode(self.masks[index], index, f"the encoded bytes of {self.files.mask(index).name}",
                      cv2.IMREAD_GRAYSCALE, self.mask_shape)
        return image, mask


def encoded_items(files: DataFiles, path: Callable[[int], Path]) -> list[bytes]:
    """Every file of one kind (``files.image`` or ``files.mask``), its bytes as read: what the encoded forms hold."""
    return [read_bytes(path(i), i) for i in range(files.spec.items)]


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
        self.images = make_store(encoded_items(files, files.image), storage)
        self.masks = make_store(decoded_items(files)[1], storage)

    def __len__(self) -> int:
        return self.files.spec.items

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        data = self.images[index]
        encoded = np.frombuffer(data, dtype=np.uint8) if isinstance(data, bytes) else data
        return torch.from_numpy(encoded.copy()), torch.from_numpy(np.ascontiguousarray(self.masks[index]))


class JpegDecodedOnHost(JpegInRam):
    """host_decode: gpu_decode's items (JPEG bytes in RAM), decoded by OpenCV in the host worker and shipped as
    uint8, so that the only difference from gpu_decode is where the decoder runs."""

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        image = decode(self.images[index], index, f"the JPEG bytes of {self.files.image(index).name}", cv2.IMREAD_COLOR,
                       (self.files.spec.image_size, self.files.spec.image_size, 3))
        return uint8_item(image, np.asarray(self.masks[index]))


def collate_encoded(items: list[tuple[Tensor, Tensor]]) -> tuple[list[Tensor], Tensor]:
    """Encoded images differ in length: keep them as a list; stack the masks."""
    return [image for image, _ in items], torch.stack([mask for _, mask in items])


def make_dataset(variant: str, files: DataFiles, storage: str,
                 cache: str = "warm") -> tuple[Dataset[Any], Callable[[list[Any]], Any]]:
    """A variant's data set and collate function; ``cache="cold"`` makes the rungs that read files read each
    from the disk (see `SegmentationItems`)."""
    cold = cache == "cold"
    rungs: dict[str, Callable[[], Dataset[Any]]] = {
        "naive": lambda: SourceFiles(files, float_item, cold=cold),
        "offline": lambda: OfflineFiles(files, float_item, cold=cold),
        "ram_encoded": lambda: EncodedInRam(files, float_item, storage),
        "ram_decoded": lambda: DecodedInRam(files, float_item, storage),
        "uint8": lambda: DecodedInRam(files, uint8_item, storage),
        "host_decode": lambda: JpegDecodedOnHost(files, storage),
        "gpu_decode": lambda: JpegInRam(files, storage),
    }
    if variant not in rungs:
        raise ValueError(f"loader variant={variant!r} is not known; allowed: {', '.join(VARIANTS)}")
    return rungs[variant](), collate_encoded if variant == "gpu_decode" else default_collate


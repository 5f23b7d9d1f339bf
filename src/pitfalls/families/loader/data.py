"""The loader family's data: a synthetic, seeded segmentation set, generated once, cached on disk, read with OpenCV.

Each item is an RGB image (stored as OpenCV gives it: height x width x 3, BGR) and a mask of ``classes`` labels.
The set is written twice: at ``source_scale`` times the training size (what the naive variant resizes on every
read, as in the article's 2048x2048 sources) and once resized offline to the training size (the article's
advice 3). Images are PNG or JPEG; masks are always PNG, since a lossy mask would change its labels.

Every item is drawn from its own seed (``[seed, index]``), so a longer set starts with the items of a shorter one,
and the same parameters give the same files on every run. The files live outside the repository, under
``$PITFALLS_DATA_CACHE`` (default ``$XDG_CACHE_HOME/pitfalls/loader``, else ``~/.cache/pitfalls/loader``), one
folder per parameter set, written to a temporary folder and renamed into place when complete, so a run that is
interrupted leaves no half-written set behind and two processes generating at once cannot mix their files.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

CACHE_ENV = "PITFALLS_DATA_CACHE"
# Part of every cache folder's name: bump it when the generation changes, so an old set is never reused.
GENERATION = 1
EXTENSIONS = {"png": ".png", "jpeg": ".jpg"}
JPEG_QUALITY = 90
# Low-frequency fields make images and masks that compress like photographs and label maps, not like noise.
_IMAGE_CELLS = 8
_MASK_CELLS = 6
_IMAGE_NOISE = 6.0


def single_threaded_opencv() -> None:
    """Run OpenCV on one thread in this process, before it first uses its thread pool.

    OpenCV's pool does not survive ``fork``: a forked DataLoader worker whose parent had started it deadlocks in
    its first OpenCV call that touches the pool (``cv2.setNumThreads`` included; seen with opencv-python 5.0).
    One thread everywhere also matches DataLoader's workers, which run torch on one thread.
    """
    if cv2.getNumThreads() != 1:
        cv2.setNumThreads(1)


class ItemReadError(RuntimeError):
    """An item of the data set cannot be read or decoded; the message names the item's index and its file."""


@dataclass(frozen=True)
class DataSpec:
    """What identifies one cached data set.

    Attributes:
        image_size: S, the training size: images are S x S x 3, masks S x S.
        items: number of items.
        classes: C, mask labels are 0..C-1.
        image_format: "png" or "jpeg" (masks are always PNG).
        source_scale: the naive variant's files are ``source_scale * S`` pixels on a side.
        seed: the data set's seed.
    """

    image_size: int
    items: int
    classes: int
    image_format: str
    source_scale: int = 2
    seed: int = 0

    def __post_init__(self) -> None:
        if self.image_format not in EXTENSIONS:
            raise ValueError(f"image_format={self.image_format!r} is not allowed; allowed: {', '.join(EXTENSIONS)}")
        if not 2 <= self.classes <= 255:
            raise ValueError(f"classes={self.classes!r} is not allowed; masks are uint8: 2 <= classes <= 255")
        for name in ("image_size", "items", "source_scale"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)!r} is not allowed; it must be >= 1")

    @property
    def source_size(self) -> int:
        return self.image_size * self.source_scale

    @property
    def key(self) -> str:
        """The cache folder's name."""
        return (f"g{GENERATION}-s{self.image_size}-x{self.source_scale}-n{self.items}-c{self.classes}"
                f"-{self.image_format}-seed{self.seed}")


def cache_root(environ: Mapping[str, str] | None = None) -> Path:
    """The folder that holds the cached data sets: ``$PITFALLS_DATA_CACHE``, else the XDG cache.

    Args:
        environ: the environment to read; None means ``os.environ``.

    Returns:
        The folder (not created here).
    """
    environ = os.environ if environ is None else environ
    if environ.get(CACHE_ENV):
        return Path(environ[CACHE_ENV]).expanduser()
    base = Path(environ["XDG_CACHE_HOME"]).expanduser() if environ.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return base / "pitfalls" / "loader"


@dataclass(frozen=True)
class DataFiles:
    """The files of one generated data set."""

    root: Path
    spec: DataSpec

    def _path(self, folder: str, index: int, ext: str) -> Path:
        return self.root / folder / f"{index:06d}{ext}"

    def source_image(self, index: int) -> Path:
        return self._path("source", index, EXTENSIONS[self.spec.image_format])

    def source_mask(self, index: int) -> Path:
        return self._path("source_masks", index, ".png")

    def image(self, index: int) -> Path:
        """The image resized offline to the training size."""
        return self._path("images", index, EXTENSIONS[self.spec.image_format])

    def mask(self, index: int) -> Path:
        """The mask resized offline to the training size."""
        return self._path("masks", index, ".png")


def _field(rng: np.random.Generator, size: int, channels: int, cells: int) -> np.ndarray:
    small = rng.random((cells, cells, channels), dtype=np.float32)
    big = cv2.resize(small, (size, size), interpolation=cv2.INTER_CUBIC)
    return big.reshape(size, size, channels)


def synthesize(spec: DataSpec, index: int) -> tuple[np.ndarray, np.ndarray]:
    """Draw one item at the source size: (image H x W x 3 uint8, mask H x W uint8 in [0, classes))."""
    rng = np.random.default_rng([spec.seed, index])
    size = spec.source_size
    image = _field(rng, size, 3, _IMAGE_CELLS) * 255 + rng.normal(0, _IMAGE_NOISE, (size, size, 3))
    mask = _field(rng, size, spec.classes, _MASK_CELLS).argmax(axis=-1)
    return np.clip(image, 0, 255).astype(np.uint8), mask.astype(np.uint8)


def encode(array: np.ndarray, image_format: str) -> bytes:
    """Encode an image (or a mask, with "png") the way the data set stores it."""
    params = [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY] if image_format == "jpeg" else []
    ok, data = cv2.imencode(EXTENSIONS[image_format], array, params)
    if not ok:
        raise RuntimeError(f"OpenCV could not encode a {array.shape} array as {image_format}")
    return data.tobytes()


def resize_image(image: np.ndarray, size: int) -> np.ndarray:
    """The naive variant's per-item resize, and the offline one: area interpolation, as for downscaling."""
    return cv2.resize(image, (size, size), interpolation=cv2.INTER_AREA)


def resize_mask(mask: np.ndarray, size: int) -> np.ndarray:
    """Masks are resized by nearest neighbour, so every label stays a label."""
    return cv2.resize(mask, (size, size), interpolation=cv2.INTER_NEAREST)


def _write(folder: Path, spec: DataSpec) -> None:
    files = DataFiles(folder, spec)
    for sub in ("source", "source_masks", "images", "masks"):
        (folder / sub).mkdir()
    for index in range(spec.items):
        image, mask = synthesize(spec, index)
        source = encode(image, spec.image_format)
        files.source_image(index).write_bytes(source)
        files.source_mask(index).write_bytes(encode(mask, "png"))
        # Resized from the decoded source file, as the naive variant resizes it on every read: with PNG the two
        # are identical; with JPEG the offline file has been through the encoder once more.
        decoded = decode(source, index, files.source_image(index), cv2.IMREAD_COLOR)
        files.image(index).write_bytes(encode(resize_image(decoded, spec.image_size), spec.image_format))
        files.mask(index).write_bytes(encode(resize_mask(mask, spec.image_size), "png"))


def ensure_data(spec: DataSpec, root: Path | None = None) -> DataFiles:
    """Return the cached data set of ``spec``, generating it first if it is not there.

    Args:
        spec: the data set.
        root: the cache folder; None means `cache_root`.

    Returns:
        Its files.
    """
    single_threaded_opencv()
    root = cache_root() if root is None else root
    final = root / spec.key
    if not final.is_dir():
        root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{spec.key}-", dir=root))
        try:
            _write(staging, spec)
            try:
                staging.rename(final)
            except OSError:
                if not final.is_dir():  # another process finished the same set first: use that one
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return DataFiles(final, spec)


# --- reading ----------------------------------------------------------------------------------------------------


def _check_shape(array: np.ndarray, index: int, source: object, shape: tuple[int, ...]) -> np.ndarray:
    if array.shape != shape:
        raise ItemReadError(f"item {index}: {source} decodes to shape {array.shape}, expected {shape}")
    return array


def decode(data: bytes | np.ndarray, index: int, source: object, flags: int,
           shape: tuple[int, ...] | None = None) -> np.ndarray:
    """Decode one item's encoded bytes with ``cv2.imdecode``, refusing what OpenCV cannot decode.

    OpenCV returns None for bytes it cannot decode, without raising: this turns that into an error.

    Args:
        data: the encoded file's bytes.
        index: the item's index, for the message.
        source: where the bytes came from (a path), for the message.
        flags: ``cv2.IMREAD_COLOR`` or ``cv2.IMREAD_GRAYSCALE``.
        shape: the shape the decoded array must have, when known.

    Returns:
        The decoded array.

    Raises:
        ItemReadError: the bytes do not decode, or decode to another shape.
    """
    buffer = np.frombuffer(data, dtype=np.uint8) if isinstance(data, bytes) else data
    array = cv2.imdecode(buffer, flags) if buffer.size else None
    if array is None:
        raise ItemReadError(f"item {index}: {source} ({buffer.size} bytes) is not a decodable image")
    return array if shape is None else _check_shape(array, index, source, shape)


def read(path: Path, index: int, flags: int, shape: tuple[int, ...] | None = None) -> np.ndarray:
    """Read and decode one file with ``cv2.imread``, refusing a missing or undecodable file.

    Args:
        path: the file.
        index: the item's index, for the message.
        flags: ``cv2.IMREAD_COLOR`` or ``cv2.IMREAD_GRAYSCALE``.
        shape: the shape the decoded array must have, when known.

    Raises:
        ItemReadError: the file is missing, cannot be decoded, or decodes to another shape.
    """
    array = cv2.imread(str(path), flags)
    if array is None:
        why = "is not a decodable image" if path.is_file() else "is missing"
        raise ItemReadError(f"item {index}: {path} {why}")
    return array if shape is None else _check_shape(array, index, path, shape)


def read_bytes(path: Path, index: int) -> bytes:
    """Read one file's encoded bytes (the article's RAM data set keeps them), naming the item if it is missing."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise ItemReadError(f"item {index}: {path} is missing") from None

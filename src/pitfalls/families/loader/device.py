"""The device side of a batch: the article's ``Normalize``, the consumer model, the copy, the JPEG decoders."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

import cv2
import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pitfalls.families.loader.data import decode
from pitfalls.family import SkipCase

# ImageNet's mean and std in 0..255, in OpenCV's BGR channel order (the data is synthetic: any fixed pair does).
MEAN = (0.406 * 255, 0.456 * 255, 0.485 * 255)
STD = (0.225 * 255, 0.224 * 255, 0.229 * 255)


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


def _host_decoder(device: torch.device, to_rgb: Callable[[np.ndarray], np.ndarray]) -> JpegDecoder:
    """A `JpegDecoder` that decodes each JPEG with OpenCV, turns its BGR pixels into RGB with ``to_rgb`` and copies
    them to ``device`` as [3, S, S]."""

    def decode_all(encoded: list[Tensor]) -> list[Tensor]:
        return [torch.from_numpy(to_rgb(decode(t.numpy(), i, "a JPEG of the batch", cv2.IMREAD_COLOR)))
                .permute(2, 0, 1).to(device) for i, t in enumerate(encoded)]

    return decode_all


def opencv_decoder(device: torch.device) -> JpegDecoder:
    """A stand-in for `torchvision_decoder` with the same contract, decoding on the host with OpenCV: it checks
    everything of gpu_decode but the device's decoder where that cannot run."""
    return _host_decoder(device, lambda bgr: np.ascontiguousarray(bgr[..., ::-1]))


def _nearest_chroma(bgr: np.ndarray) -> np.ndarray:
    """RGB pixels of a decoded image whose chroma is each 2 x 2 block's mean, repeated over the block."""
    ycrcb = cv2.cvtColor(bgr, cv2.COLOR_BGR2YCrCb).astype(np.float32)
    height, width = ycrcb.shape[:2]
    blocks = ycrcb[:, :, 1:].reshape(height // 2, 2, width // 2, 2, 2).mean(axis=(1, 3))
    ycrcb[:, :, 1:] = blocks.repeat(2, axis=0).repeat(2, axis=1)
    return cv2.cvtColor(np.clip(np.rint(ycrcb), 0, 255).astype(np.uint8), cv2.COLOR_YCrCb2RGB)


def nearest_chroma_decoder(device: torch.device) -> JpegDecoder:
    """A host model of what `torchvision_decoder` gives on CUDA, to calibrate the gate where no GPU is.

    nvJPEG, under ``decode_jpeg(device="cuda")``, rebuilds the chroma of a 4:2:0 JPEG (OpenCV's default) by
    nearest neighbour, where OpenCV's libjpeg-turbo interpolates it. This decodes with OpenCV, takes each 2 x 2
    block's mean chroma (the encoder's sample, to rounding) and repeats it over the block. At the gate's size it
    reads 13.2 grey levels from naive on average where an H200 read 12.3.
    """
    return _host_decoder(device, _nearest_chroma)

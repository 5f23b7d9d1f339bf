"""The gate: what each variant delivers to the device against what ``naive`` delivers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from pitfalls.families.loader.device import STD, JpegDecoder, opencv_decoder
from pitfalls.families.loader.steps import make_step
from pitfalls.family import Comparison, Family, SkipCase

# JPEG: the offline files went through the encoder once more than the naive variant's, so pixels differ. Measured
# at quality 90 (mean |difference| over 8 items): 7.7 grey levels at 32x32 (the smoke size: its 8 colour cells
# span a few JPEG blocks each), 3.5 at 64x64, 1.8 at 512x512; a swapped channel order gives about 50, another
# item more. Allowed on average, in normalized units (grey levels divided by the smallest std):
JPEG_MEAN_ABS_LEVELS = 10.0
# gpu_decode's own decoder, nvJPEG, rebuilds 4:2:0 chroma by nearest neighbour where OpenCV interpolates it: on an
# H200 its images read 12.3 grey levels from naive's on average at the smoke size (0.216 normalized, over the
# allowance above), and `nearest_chroma_decoder`, the same rule on the host, reads 13.2 (1.5 against OpenCV's 1.3
# at 512x512, where the edges it blurs are a smaller share of the pixels). Allowed on top, for that decoder alone:
NVJPEG_CHROMA_LEVELS = 6.0
# PNG: bit-exact on the CPU; on a GPU the normalize may round differently from the host's.
PNG_ABS_TOLERANCE = 1e-5
COMPARED_BATCHES = 2


def jpeg_tolerance(variant: str) -> float:
    """The mean |image difference| from naive allowed on JPEG, in normalized units (gpu_decode's decoder on top)."""
    levels = JPEG_MEAN_ABS_LEVELS + (NVJPEG_CHROMA_LEVELS if variant == "gpu_decode" else 0.0)
    return levels / min(STD)


def delivered(variant: str, device: torch.device, params: Mapping[str, Any], batches: int = COMPARED_BATCHES,
              decoder: JpegDecoder | None = None) -> list[tuple[Tensor, Tensor]]:
    """The first ``batches`` batches a variant delivers to the device (normalized images, int64 masks)."""
    with make_step(variant, device, params, decoder=decoder) as step:
        return [step.inputs() for _ in range(batches)]


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

    PNG must agree within float rounding (bit-exact on the CPU); JPEG within `jpeg_tolerance` on average (the
    OpenCV stand-in within the host decoders' tolerance); masks exactly. What cannot run here is named in the
    detail, as is every failure: gpu_decode runs on JPEG only, and where its device decoder cannot run (no CUDA,
    no torchvision) everything but that decoder is checked, with OpenCV decoding the JPEG bytes it ships; the row
    is then not run (a stand-in never passes), or failed if even the rest differs. The max abs diff reported is
    PNG's where PNG ran (the exact comparison), else JPEG's.
    """
    failed, notes, stand_in = [], [], ""
    worst: dict[str, float] = {}
    for image_format in ("png", "jpeg"):
        params = family.resolve({**family.smoke, "image_format": image_format})
        try:
            got = delivered(variant, device, params)
        except SkipCase as skip:
            if variant != "gpu_decode" or image_format != "jpeg":
                notes.append(f"{image_format} not run: {skip.reason}")
                continue
            stand_in = f"OpenCV decoded its JPEG bytes on the host: the device decoder cannot run ({skip.reason})"
            got = delivered(variant, device, params, decoder=opencv_decoder(device))
        max_diff, mean_diff, masks_equal = differences(got, delivered(family.baseline, device, params))
        worst[image_format] = max_diff
        if not masks_equal:
            failed.append(f"{image_format}: masks differ")
        elif image_format == "png" and max_diff > PNG_ABS_TOLERANCE:
            failed.append(f"png: images differ by up to {max_diff:.3g}")
        elif image_format == "jpeg" and mean_diff > (allowed := jpeg_tolerance("" if stand_in else variant)):
            failed.append(f"jpeg: images differ by {mean_diff:.3g} on average (allowed {allowed:.3g})")
    if not worst:
        failed.append("no format could run here")
    detail = "; ".join(failed + notes)
    reported = worst.get("png", worst.get("jpeg", float("inf")))
    if stand_in and not failed:  # the rest of the variant matches, but its own decoder never ran: not a pass
        return Comparison.not_run(family.name, variant, str(device), f"{stand_in}; the rest matches naive",
                                  stand_in="opencv_decoder")
    detail = "; ".join(filter(None, (detail, stand_in)))
    return Comparison(family.name, variant, str(device), not failed, reported, detail,
                      stand_in="opencv_decoder" if stand_in else "")


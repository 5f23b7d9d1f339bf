"""The copy rules: each non-blocking copy between host and device of the scanned steps (`copies.CopyRecorder`), by
line; a blocking copy is a sync, found by the sync rules.
"""

from __future__ import annotations

from collections.abc import Callable

from pitfalls.doctor.copies import HOST_TO_DEVICE, CopySite
from pitfalls.doctor.planted import RULES as SCRIPT
from pitfalls.doctor.records import Seen
from pitfalls.doctor.rule import Hit, Plant, Rule
from pitfalls.units import human_bytes

__all__ = ["FILL", "PAGEABLE", "PINNED", "RULES"]

_READS = "the copy recorder of the scanned steps (bytes, direction, pinned or pageable, blocking or not)"


def _finder(which: Callable[[CopySite], bool]) -> Callable[[Seen], list[Hit]]:
    def find(seen: Seen) -> list[Hit]:
        scan = seen.scan
        if scan is None or scan.steps == 0:
            return []
        hits = []
        for site in scan.copies:
            if site.blocking or not which(site):
                continue
            per_step = site.bytes / scan.steps
            memory = "pinned" if site.pinned else "pageable"
            if seen.bandwidth is None:
                ms, cost = None, f"not measured: {seen.no_gpu}"
            else:
                ms = per_step / seen.bandwidth.rate(site.direction, site.pinned) * 1e3
                cost = f"estimated: bytes over the {memory} {site.direction} bandwidth measured on the device"
            title = (f"{site.direction} copy of {human_bytes(per_step)} a step ({site.call}, {memory}, non-blocking)"
                     + (f" of a tensor {site.made_by} made on the host" if site.made_by else ""))
            hits.append(Hit(title, site.line, site.count / scan.steps, ms, cost))
        return hits

    return find


FILL = Rule(
    "host fill copied without blocking", "copy",
    "a tensor a factory (torch.randn, zeros, arange, tensor, ...) fills on the host each step, then copies to the "
    "device with non_blocking=True",
    "make it on the device: the factory with device=device fills it there, with no copy and no host memory to pin",
    "PyTorch's profiler pattern matcher (torch.profiler._pattern_matcher): ExtraCUDACopyPattern", _READS,
    _finder(lambda site: site.direction == HOST_TO_DEVICE and bool(site.made_by)),
    Plant.of(SCRIPT, "ahead = torch.randn(BATCH, CLASSES).to(device, non_blocking=True)",
             "jitter = torch.randn(BATCH, CLASSES, device=device)"))
PAGEABLE = Rule(
    "non-blocking copy from pageable memory", "copy",
    "a non-blocking copy between the device and pageable host memory: the driver stages it, so it does not overlap "
    "the step",
    "pin the host memory: DataLoader(pin_memory=True), .pin_memory(), or torch.empty(..., pin_memory=True) for a "
    "buffer to copy into",
    "Nsight Systems' expert rules: async memcpy with pageable memory", _READS,
    _finder(lambda site: not site.pinned and not site.made_by),
    Plant.of(SCRIPT, "images = images.to(device, non_blocking=True)",
             "weight = weight.to(device, non_blocking=True)"))
PINNED = Rule(
    "bytes of a pinned copy", "copy",
    "a non-blocking copy from pinned memory, the right way to copy: its bytes still take the copy engine's time",
    "copy fewer bytes (smaller dtypes: see the batch's dtypes) or overlap the copy with the step's work",
    "article 001 (uint8 images and masks, normalized on the device: 5x fewer bytes)", _READS,
    _finder(lambda site: site.pinned and not site.made_by),
    Plant.of(SCRIPT, "weight = weight.to(device, non_blocking=True)",
             "jitter = torch.randn(BATCH, CLASSES, device=device)"))
RULES = (FILL, PAGEABLE, PINNED)

"""Copies between host and device during the scanned steps: bytes, direction, pinned or pageable, blocking or not.

`CopyRecorder` sees each copy at the Python call the script wrote and compares where its source and its result live:
on a GPU run their devices; on a CPU run the counter's provenance (`pitfalls.probes.hostcopy.Provenance`), where the
GPU program would hold them. `copy_bandwidth` times the device's copies, once the script has stopped.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass
from typing import Literal

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from pitfalls.probes.hostcopy import Provenance, to_non_blocking
from pitfalls.probes.sites import SourceLine, locate_dispatch, source_line

__all__ = ["DEVICE_TO_HOST", "HOST_TO_DEVICE", "Bandwidth", "CopyRecorder", "CopySite", "Direction", "copy_bandwidth"]

Direction = Literal["host to device", "device to host"]
HOST_TO_DEVICE: Direction = "host to device"
DEVICE_TO_HOST: Direction = "device to host"
# 64 MiB: large enough that a copy's fixed latency is a few percent of it.
BANDWIDTH_BYTES = 64 << 20
# Timed copies of each kind, after one untimed.
REPEATS = 3

_MOVES = {torch.Tensor.to: "Tensor.to", torch.Tensor.cuda: "Tensor.cuda", torch.Tensor.cpu: "Tensor.cpu"}
_FROM_DATA = {torch.tensor: "torch.tensor", torch.as_tensor: "torch.as_tensor", torch.asarray: "torch.asarray"}


@dataclass(frozen=True)
class CopySite:
    """The copies of one kind made at one line over the scanned steps.

    Attributes:
        line: the script's line, or None when no frame outside torch made them.
        call: the call, e.g. "Tensor.to".
        pinned: the host side was page-locked memory.
        blocking: the host waited for the copy (no ``non_blocking=True``, or a call that always waits).
        count: copies over the scanned steps, of ``bytes`` in all.
        made_by: the factory that filled the host side on the host ("torch.randn"), for a copy to the device
            that could be made there instead; "" for host data of another kind (a batch).
    """

    line: SourceLine | None
    call: str
    direction: Direction
    pinned: bool
    blocking: bool
    count: int
    bytes: int
    made_by: str = ""


def _pinned(tensor: torch.Tensor, provenance: Provenance) -> bool:
    # is_pinned asks the accelerator; a CPU build answers False, so a batch its loader would pin is read from the
    # provenance.
    return tensor.device.type == "cpu" and (bool(tensor.is_pinned()) or provenance.pinned(tensor))


class CopyRecorder(TorchFunctionMode):
    """Record each copy between host and device made inside the block, at the script's line.

    Args:
        provenance: the counter's host-made tensors (read on a CPU run).
        real_devices: the run has an accelerator: a tensor is on the host when it is on the CPU.
    """

    def __init__(self, provenance: Provenance, real_devices: bool) -> None:
        super().__init__()
        self._provenance = provenance
        self._real = real_devices
        self._seen: Counter[tuple[tuple[str, int, str] | None, str, Direction, bool, bool, str]] = Counter()
        self._bytes: Counter[tuple[tuple[str, int, str] | None, str, Direction, bool, bool, str]] = Counter()

    def _on_host(self, tensor: torch.Tensor) -> bool:
        if tensor.device.type != "cpu":
            return False
        return self._real or self._provenance.on_host(tensor)

    def _record(self, call: str, to_device: bool, host: torch.Tensor, nbytes: int, blocking: bool) -> None:
        direction = HOST_TO_DEVICE if to_device else DEVICE_TO_HOST
        made_by = self._provenance.made_by(host) if to_device else ""
        key = (locate_dispatch()[0], call, direction, _pinned(host, self._provenance), blocking, made_by)
        self._seen[key] += 1
        self._bytes[key] += nbytes

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204 (torch's protocol)
        kwargs = kwargs or {}
        src = args[0] if args and isinstance(args[0], torch.Tensor) else None
        src_on_host = src is not None and self._on_host(src)
        out = func(*args, **kwargs)
        if func in _MOVES and src is not None:
            if isinstance(out, torch.Tensor) and out.device.type != "meta" and src_on_host != self._on_host(out):
                blocking = func is torch.Tensor.cpu or not to_non_blocking(args, kwargs)
                self._record(_MOVES[func], src_on_host, src if src_on_host else out, src.nbytes, blocking)
        elif func is torch.Tensor.tolist and src is not None and not src_on_host and src.numel():
            self._record("Tensor.tolist", False, src, src.nbytes, True)
        elif func is torch.Tensor.copy_ and src is not None and len(args) > 1 and isinstance(args[1], torch.Tensor):
            source = args[1]
            source_on_host = self._on_host(source)
            if source_on_host != src_on_host:
                host = source if source_on_host else src
                self._record("Tensor.copy_", source_on_host, host, source.nbytes, not to_non_blocking(args, kwargs))
        elif func in _FROM_DATA and isinstance(out, torch.Tensor) and not self._on_host(out):
            data = [leaf for leaf in tree_flatten(args[:1])[0] if isinstance(leaf, torch.Tensor)]
            if not data or all(self._on_host(t) for t in data):
                self._record(_FROM_DATA[func], True, data[0] if data else out, out.nbytes, True)
        return out

    @property
    def sites(self) -> tuple[CopySite, ...]:
        """The copies by line and kind, the most bytes first."""
        found = [
            CopySite(source_line(line), call, direction, pinned, blocking, count, self._bytes[where], made_by)
            for where, count in self._seen.items() for line, call, direction, pinned, blocking, made_by in [where]
        ]
        return tuple(sorted(found, key=lambda site: (-site.bytes, site.call)))


@dataclass(frozen=True)
class Bandwidth:
    """Copy bandwidth measured on the device, bytes per second, by (direction, pinned)."""

    device: str
    rates: tuple[tuple[Direction, bool, float], ...]

    def rate(self, direction: Direction, pinned: bool) -> float:
        """Bytes per second of one kind of copy."""
        return next(rate for d, p, rate in self.rates if d == direction and p == pinned)


def copy_bandwidth(device: torch.device) -> Bandwidth:
    """Time copies of `BANDWIDTH_BYTES` both ways, pinned and pageable, with CUDA events (the median of `REPEATS`).

    Args:
        device: a CUDA device the script has initialized.

    Returns:
        The `Bandwidth`.
    """
    on_device = torch.empty(BANDWIDTH_BYTES, dtype=torch.uint8, device=device)
    rates = []
    for pinned in (False, True):
        host = torch.empty(BANDWIDTH_BYTES, dtype=torch.uint8, pin_memory=pinned)
        for direction, copy in ((HOST_TO_DEVICE, lambda h=host: on_device.copy_(h, non_blocking=True)),
                                (DEVICE_TO_HOST, lambda h=host: h.copy_(on_device, non_blocking=True))):
            times = []
            for _ in range(REPEATS + 1):
                begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                begin.record()
                copy()
                end.record()
                end.synchronize()
                times.append(begin.elapsed_time(end) / 1e3)
            rates.append((direction, pinned, BANDWIDTH_BYTES / statistics.median(times[1:])))
    return Bandwidth(str(device), tuple(rates))

"""What a published figure is, measured one way wherever it is published (asv, the GPU proof, the budgeted run)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from pitfalls.devices import synchronize
from pitfalls.probes.nvml import NvmlSampler, NvmlSummary
from pitfalls.probes.result import Unavailable

__all__ = ["nvml_window"]


def nvml_window(call: Callable[[], Any], device: torch.device, seconds: float) -> NvmlSummary | Unavailable:
    """Loop ``call`` for ``seconds`` while NVML samples ``device``'s GPU; what NVML saw.

    The calls are queued without a synchronize between them, as a training loop queues its steps; the device is
    synchronized once at the end, inside the window, so the last calls' work is sampled too.

    Args:
        call: one call of the case (a step, a batch).
        device: where it runs (NVML reads its GPU; on a CPU every metric is unavailable with the reason).
        seconds: the window's length.

    Returns:
        NVML's summary of the window, or why NVML could not read it.
    """
    if device.type != "cuda":
        return Unavailable(f"case runs on {device}: no GPU for NVML to read")
    with NvmlSampler(device) as sampler:
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            call()
        synchronize(device)
    return sampler.summary

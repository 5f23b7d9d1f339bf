"""One place that decides whether CUDA can be used here, so every probe gives the same reason when it cannot.

On the CPU build of torch, `torch.cuda.synchronize`, `current_device` and `set_sync_debug_mode` raise
`AssertionError: Torch not compiled with CUDA enabled`, while `is_available()` and `device_count()` do not; every
probe therefore asks `cuda_unavailable_reason()` before it touches anything else in `torch.cuda`.
"""

from __future__ import annotations

from typing import Any

import torch

from pitfalls.result import Unavailable

__all__ = ["NO_CUDA_BUILD", "NO_CUDA_DEVICE", "cuda_module", "cuda_unavailable_reason", "is_cuda_device"]

NO_CUDA_BUILD = "no CUDA device: torch built without CUDA"
NO_CUDA_DEVICE = "no CUDA device"


def cuda_unavailable_reason() -> str | None:
    """Say why CUDA cannot be used in this process, or None when it can.

    Returns:
        "no CUDA device: torch built without CUDA", "no CUDA device", or None.
    """
    if not torch.backends.cuda.is_built():
        return NO_CUDA_BUILD
    if not torch.cuda.is_available():
        return NO_CUDA_DEVICE
    return None


def cuda_module(cuda: Any = None) -> Any:
    """The `torch.cuda`-like module a CUDA probe uses: the one given (tests pass a fake), else `torch.cuda` when
    it can be used here, else `Unavailable` with the reason."""
    if cuda is not None:
        return cuda
    reason = cuda_unavailable_reason()
    return torch.cuda if reason is None else Unavailable(reason)


def is_cuda_device(device: torch.device | str | None) -> bool:
    """Tell whether a device names a CUDA device (without initialising CUDA).

    Args:
        device: a torch.device, a string such as "cuda:0", or None (meaning the CPU).

    Returns:
        True for a CUDA device.
    """
    if device is None:
        return False
    return torch.device(device).type == "cuda"

"""One place that decides whether CUDA can be used here, so every probe gives the same reason when it cannot.

On the CPU build of torch, `torch.cuda.synchronize`, `current_device` and `set_sync_debug_mode` raise
`AssertionError: Torch not compiled with CUDA enabled`, while `is_available()` and `device_count()` do not; every
probe therefore asks `cuda_unavailable_reason()` before it touches anything else in `torch.cuda`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from pitfalls._checks import check_callable, check_int_at_least
from pitfalls.result import Unavailable

__all__ = ["cuda_unavailable_reason", "is_cuda_device", "warmed_cuda"]


def cuda_unavailable_reason() -> str | None:
    """Say why CUDA cannot be used in this process, or None when it can.

    Returns:
        "no CUDA device: torch built without CUDA", "no CUDA device", or None.
    """
    if not torch.backends.cuda.is_built():
        return "no CUDA device: torch built without CUDA"
    return None if torch.cuda.is_available() else "no CUDA device"


def warmed_cuda(fn: Callable[[], object], calls: int, warmup: int, cuda: Any = None) -> Any:
    """Check a CUDA probe's arguments, find its `torch.cuda`-like module and run ``warmup`` untimed calls of ``fn``.

    Args:
        fn: the zero-argument callable the probe measures.
        calls: the calls it will measure (>= 1).
        warmup: untimed calls to run now (>= 0).
        cuda: the module to use (tests pass a fake); None means `torch.cuda` when it can be used here.

    Returns:
        The module, after the warm-up calls, or `Unavailable` with the reason (then nothing was called).
    """
    check_callable("fn", fn)
    check_int_at_least("calls", calls, 1)
    check_int_at_least("warmup", warmup, 0)
    if cuda is None:
        reason = cuda_unavailable_reason()
        if reason is not None:
            return Unavailable(reason)
        cuda = torch.cuda
    for _ in range(warmup):
        fn()
    return cuda


def is_cuda_device(device: torch.device | str | None) -> bool:
    """Tell whether a device names a CUDA device (without initialising CUDA).

    Args:
        device: a torch.device, a string such as "cuda:0", or None (meaning the CPU).

    Returns:
        True for a CUDA device.
    """
    return device is not None and torch.device(device).type == "cuda"

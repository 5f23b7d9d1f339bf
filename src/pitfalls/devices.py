"""Device resolution, synchronization and a memory guard that turns a case too big to fit into a reasoned skip."""

from __future__ import annotations

import psutil
import torch


def cuda_available() -> bool:
    """Return True when this torch build has CUDA and a device is visible."""
    return bool(torch.cuda.is_available() and torch.cuda.device_count() > 0)


def available_devices() -> tuple[str, ...]:
    """Return the device names this machine can run: always ``"cpu"``, ``"cuda"`` when present."""
    return ("cpu", "cuda") if cuda_available() else ("cpu",)


def resolve_device(name: str | torch.device) -> torch.device:
    """Turn a device name into a ``torch.device``, refusing devices this machine does not have.

    Args:
        name: ``"cpu"``, ``"cuda"`` or ``"cuda:N"`` (or a ``torch.device``).

    Returns:
        The device; a bare ``"cuda"`` becomes the current CUDA device.
    """
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"device={name!r} is not a device name; allowed: cpu, cuda, cuda:N") from error
    if device.type == "cpu":
        return device
    if device.type != "cuda":
        raise ValueError(f"device={name!r} is not supported; allowed: cpu, cuda, cuda:N")
    if not cuda_available():
        raise ValueError(f"device={name!r} is not available: no CUDA device on this machine")
    index = torch.cuda.current_device() if device.index is None else device.index
    if index >= torch.cuda.device_count():
        raise ValueError(
            f"device={name!r} is not available: this machine has {torch.cuda.device_count()} CUDA device(s)"
        )
    return torch.device("cuda", index)


def synchronize(device: torch.device | str | None) -> None:
    """Wait for all queued work on ``device``; a no-op on the CPU (or None), where work is done on return."""
    # Guarded by type: torch.cuda.synchronize raises AssertionError on a CPU-only torch build.
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(torch.device(device))


def free_memory_bytes(device: torch.device) -> int:
    """Return the bytes that can still be allocated on ``device`` (host: available RAM)."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    return int(psutil.virtual_memory().available)


def fits(device: torch.device, needed_bytes: int, *, headroom: float = 0.8) -> tuple[bool, str]:
    """Tell whether ``needed_bytes`` fits on ``device``, with the estimate in the reason.

    Args:
        device: where the case would allocate.
        needed_bytes: an estimate made before allocating anything.
        headroom: the share of free memory a case may use; the rest is left for the allocator and the OS.

    Returns:
        ``(True, "")`` or ``(False, reason)`` with both figures in GiB.
    """
    free = free_memory_bytes(device)
    if needed_bytes <= headroom * free:
        return True, ""
    gib = 1024**3
    return False, (
        f"needs about {needed_bytes / gib:.1f} GiB on {device}, "
        f"{free / gib:.1f} GiB free (limit {headroom:.0%} of free)"
    )

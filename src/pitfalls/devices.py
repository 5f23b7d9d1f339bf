"""Device resolution, synchronization and a memory guard that turns a case too big to fit into a reasoned skip."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import psutil
import torch

# Intra-op threads of a step on a CPU device: one core is one CPU "device", as one GPU is on a GPU machine. With
# torch's default (one thread per core) a step's threads wait on each other at every parallel region on cores
# shared with workers, ranks or other jobs: the loader's 1x1-conv step took 28-80 ms on 2 cores against 1-3 ms on
# one thread, and the parallel family's one-process step 134-400 ms against 62-70 ms, so a figure measured that
# contention, not the case. Every process of a case (the benchmark process, a loader's main process, each gloo
# rank) runs its step on this many threads.
CPU_DEVICE_THREADS = 1


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


@contextlib.contextmanager
def device_threads(device: torch.device) -> Iterator[None]:
    """Run a step on `CPU_DEVICE_THREADS` intra-op threads on a CPU device (torch's own count restored after);
    nothing changes on a GPU, whose host thread only queues work."""
    if device.type != "cpu":
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(CPU_DEVICE_THREADS)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


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

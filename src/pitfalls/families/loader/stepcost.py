"""A training step of adjustable cost (the ``model_ms`` axis): the device busy for a planted time per batch.

The verdict asks at which step cost the loader starts to starve the device, so the step's cost must be a known,
adjustable quantity rather than whatever the small consumer model costs on this machine:

- on the CPU, `BusyFor` spins on the clock until a deadline: busy (it holds a core, as a CPU training step does),
  and exact in wall time whatever else the machine runs. It spins in Python rather than in torch: a torch product,
  however small, ran on both intra-op threads here, and on 2 loaded cores one of them waiting for the other
  overran a 20 ms deadline by up to 36 ms. The interpreter hands the GIL over every few milliseconds, so the
  loader's own threads (the index queue's feeder) still run;
- on a GPU the host cannot watch a deadline without synchronizing, so `MatmulLoop` queues a fixed number of
  products, sized once per device by `size_loop`: the time of a run of products, synchronized, gives the time of
  one, and the count is the planted time over it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from pitfalls.devices import synchronize

__all__ = ["GPU_SIDE", "BusyFor", "MatmulLoop", "LoopSize", "planted_cost", "size_loop"]

# The matrices' side: a GPU product of tens of microseconds keeps the launch cost out of the per-product time.
GPU_SIDE = 2048
# Products timed to size the GPU loop: long enough against one synchronize, short against a calibration.
SIZING_PRODUCTS = 50


class BusyFor:
    """Keep the CPU busy for ``seconds``: spin on the clock until the deadline.

    Args:
        seconds: the planted time per call.
        clock: the deadline's clock (a test plants its own).
    """

    def __init__(self, seconds: float, clock: Callable[[], float] = time.perf_counter) -> None:
        self.seconds = seconds
        self.clock = clock
        self.spins = 0

    def __call__(self, *_batch: Tensor) -> None:
        deadline = self.clock() + self.seconds
        while self.clock() < deadline:
            self.spins += 1


@dataclass(frozen=True)
class LoopSize:
    """A GPU loop sized for a planted time.

    Attributes:
        products: products per call.
        seconds_per_product: measured when sizing.
    """

    products: int
    seconds_per_product: float

    @property
    def seconds(self) -> float:
        """The time the loop should take per call."""
        return self.products * self.seconds_per_product


def size_loop(seconds: float, run: Callable[[int], None], sync: Callable[[], None],
              clock: Callable[[], float] = time.perf_counter, probe: int = SIZING_PRODUCTS) -> LoopSize:
    """Size a loop of products to take ``seconds``: run ``probe`` of them once to warm up, then time ``probe`` more,
    synchronized, and divide.

    Args:
        seconds: the planted time per call.
        run: queues ``n`` products on the device.
        sync: waits until the device is done.
        clock: the host clock.
        probe: products timed.

    Returns:
        The products per call (at least 1 where ``seconds`` > 0) and the time of one.
    """
    run(probe)
    sync()
    began = clock()
    run(probe)
    sync()
    per_product = (clock() - began) / probe
    if per_product <= 0:
        raise RuntimeError(f"a product took {per_product} s: the clock did not advance while timing {probe} of them")
    products = max(1, round(seconds / per_product)) if seconds > 0 else 0
    return LoopSize(products, per_product)


_SIZES: dict[tuple[float, str, int], LoopSize] = {}


class MatmulLoop:
    """Keep a GPU busy for a planted time: a fixed number of matrix products per call, sized by `size_loop`.

    Args:
        seconds: the planted time per call.
        device: the device.
        side: the matrices' side.
    """

    def __init__(self, seconds: float, device: torch.device, side: int = GPU_SIDE) -> None:
        self.device = device
        self.a = torch.rand(side, side, device=device)
        self.b = torch.rand(side, side, device=device)
        self.out = torch.empty(side, side, device=device)
        # Sized once per planted time, device and side in a process: each case would otherwise size it again.
        key = (seconds, str(device), side)
        if key not in _SIZES:
            _SIZES[key] = size_loop(seconds, self.run, lambda: synchronize(device))
        self.size = _SIZES[key]

    def run(self, products: int) -> None:
        for _ in range(products):
            torch.mm(self.a, self.b, out=self.out)

    def __call__(self, *_batch: Tensor) -> None:
        self.run(self.size.products)


def planted_cost(model_ms: float, device: torch.device) -> Callable[..., None] | None:
    """The step cost of ``model_ms`` milliseconds per batch on ``device``, or None for 0 (the model step alone)."""
    if model_ms <= 0:
        return None
    if device.type == "cuda":
        return MatmulLoop(model_ms / 1000, device)
    return BusyFor(model_ms / 1000)


def planted_against_measured(model_ms: float, device: torch.device, calls: int = 10) -> tuple[float, float]:
    """(planted, measured) milliseconds per call of `planted_cost` on ``device``: the median of ``calls`` calls after
    one, each synchronized (``scripts/gpu-run``'s step cost piece reads the GPU loop's sizing with it). The median,
    since a loaded host that preempts a call can only lengthen it."""
    cost = planted_cost(model_ms, device)
    if cost is None:
        raise ValueError(f"model_ms={model_ms} plants no cost; allowed: a value > 0")
    cost()
    synchronize(device)
    times = []
    for _ in range(calls):
        began = time.perf_counter()
        cost()
        synchronize(device)
        times.append(time.perf_counter() - began)
    return model_ms, statistics.median(times) * 1e3

"""The article's consequence in numbers: the largest global batch each variant fits on the GPUs at hand.

DataParallel gathers every replica's logits on device 0, which then computes the loss and its gradient alone, so
device 0 fills first and the global batch must shrink; DDP's ranks each hold 1/W. A bounded search per variant
(doubling, then bisection) tries real steps, with the allocator emptied and its peak reset between tries.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from pitfalls.result import Unavailable

__all__ = ["BATCH_LIMIT", "Stopped", "fits_on_gpu", "largest_fitting"]

# Images per rank the search never goes beyond (a bound on its time: each try is a real step).
BATCH_LIMIT = 1024


@dataclass(frozen=True)
class Stopped:
    """A search its time limit ended: ``low`` images per rank ran, a larger batch was not settled.

    Attributes:
        low: the largest batch per rank that ran before the limit.
        high: the smallest that did not fit, or None when none failed yet.
    """

    low: int
    high: int | None


def largest_fitting(fits: Callable[[int], bool], *, limit: int = BATCH_LIMIT, deadline: float | None = None,
                    clock: Callable[[], float] = time.monotonic) -> int | Stopped | Unavailable:
    """The largest ``n`` in 1..``limit`` with ``fits(n)``, assuming what fits stays fitting below it.

    Args:
        fits: tries ``n`` (images per rank) and tells whether it ran.
        limit: the bound of the search.
        deadline: a ``clock()`` after which no further try starts (a try under way is finished).
        clock: the clock of ``deadline``.

    Returns:
        ``n``; `Stopped` with what was settled when the deadline came first; `Unavailable` when not even one
        image fits.
    """
    if not fits(1):
        return Unavailable("not even 1 image per rank fits")

    def late() -> bool:
        return deadline is not None and clock() > deadline

    low, high = 1, 2
    while high <= limit:
        if late():
            return Stopped(low, None)
        if not fits(high):
            break
        low, high = high, high * 2
    high = min(high, limit + 1)  # low fits; high does not (or is past the limit)
    while high - low > 1:
        if late():
            return Stopped(low, high)
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


def fits_on_gpu(variant: str, world_size: int, image_size: int) -> Callable[[int], bool]:
    """A ``fits(batch)`` that builds the variant on the GPUs with ``batch`` images per rank and runs two steps.

    An out-of-memory error (in this process, or in a rank: its `RankFailed` names it) means "does not fit". The
    family's memory estimate does not refuse a try (`parallel.estimates_off`): the answer is measured, and a case
    skipped for another reason is not taken for "too big" (it ends the search with its reason). Between tries the
    allocator is emptied and its peak reset on every device.
    """
    from pitfalls.distributed import RankFailed
    from pitfalls.families.parallel.entry import FAMILY, estimates_off

    def fits(batch: int) -> bool:
        try:
            with estimates_off(), FAMILY.build(
                    variant, device="cuda", world_size=world_size, batch=batch, image_size=image_size) as case:
                for _ in range(2):
                    case()
                torch.cuda.synchronize()
            return True
        except torch.OutOfMemoryError:
            return False
        except RankFailed as failure:
            if "out of memory" in str(failure).lower():
                return False
            raise
        finally:
            for index in range(torch.cuda.device_count()):
                torch.cuda.synchronize(index)
                torch.cuda.reset_peak_memory_stats(index)
            torch.cuda.empty_cache()

    return fits

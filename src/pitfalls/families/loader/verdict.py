"""The verdict: is the loader the bottleneck, and below which step cost does it starve the device?

A steady-state run (`steady.run`) splits each batch's time into the wait in ``next()`` and the step. The case is
**loader-bound** when the wait is more than `WAIT_THRESHOLD` of the batch's time, else **step-bound**; the margin
is the wait share less the threshold. From the same run, the step cost below which the loader starves the device
(its wait share above the threshold), by how the loader overlaps the step:

- without workers the main process loads a batch, then steps: the wait per batch ``w`` is the loading time
  whatever the step, and the share ``w / (w + s)`` exceeds the threshold ``t`` for any step ``s < w (1 - t) / t``;
- with workers, loading overlaps the step: a loader-bound run's period ``L`` (seconds per batch) is the pace of
  the workers, and the share ``(L - s) / L`` exceeds ``t`` for ``s < (1 - t) L``. A step-bound run only says
  that the workers kept up with this step: the crossover is below it, and a smaller ``model_ms`` reads it.

On a CPU the step and the workers share the cores, so the workers' pace there falls as the step grows; on a GPU
the step's device work leaves the host's cores to the workers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pitfalls.families.loader import steady
from pitfalls.families.loader.entry import read_case
from pitfalls.result import Unavailable

__all__ = ["MODEL_MS", "STARVES_BELOW", "WAIT_THRESHOLD", "Bound", "Verdict", "bound", "judge", "verdict"]

# The share of a batch's time the step may wait in next() and still be step-bound (``pitfalls scan-loader`` judges
# by it too): sleep-planted step-bound pipelines read under 2 % on this 2-core machine.
WAIT_THRESHOLD = 0.10
Bound = Literal["loader-bound", "step-bound"]


def bound(wait_share: float, threshold: float = WAIT_THRESHOLD) -> Bound:
    """"loader-bound" when the wait share is above the threshold, else "step-bound"."""
    return "loader-bound" if wait_share > threshold else "step-bound"
# The name `probes.own_figures` gives `Verdict.starves_below_s` (and the asv method that publishes it).
STARVES_BELOW = "starves the device below"
# The model_ms values each grid sweeps in the verdict (milliseconds of planted step cost; 0: the model step alone).
MODEL_MS: dict[str, tuple[int, ...]] = {"quick": (0,), "full": (0, 2, 10, 50)}


@dataclass(frozen=True)
class Verdict:
    """One case's verdict, from one steady-state run.

    Attributes:
        wait_share: the share of each batch's time spent waiting in ``next()``.
        seconds_per_batch: the run's period.
        wait_per_batch: the wait in ``next()`` per batch, in seconds.
        workers: the loader's workers (0: loading and the step take turns).
        threshold: `WAIT_THRESHOLD`.
    """

    wait_share: float
    seconds_per_batch: float
    wait_per_batch: float
    workers: int
    threshold: float = WAIT_THRESHOLD

    @property
    def bound(self) -> Bound:
        """The verdict at the threshold."""
        return bound(self.wait_share, self.threshold)

    @property
    def margin(self) -> float:
        """The wait share less the threshold: above 0 loader-bound by that much, below 0 step-bound."""
        return self.wait_share - self.threshold

    @property
    def starves_below_s(self) -> float | Unavailable:
        """The step cost (seconds per batch) below which the loader starves the device (see the module)."""
        t = self.threshold
        if self.workers == 0:
            return self.wait_per_batch * (1 - t) / t
        if self.bound == "step-bound":
            return Unavailable(f"step-bound (waits {self.wait_share:.1%} of each batch): the workers kept up with "
                               f"this step of {self.seconds_per_batch * 1e3:.3g} ms a batch, so they starve only a "
                               "shorter one; a smaller model_ms reads it")
        return (1 - t) * self.seconds_per_batch

    def describe(self) -> str:
        """One line: the verdict, the margin and the crossover."""
        below = self.starves_below_s
        crossing = (f"n/a ({below.reason})" if isinstance(below, Unavailable) else f"{below * 1e3:.3g} ms")
        return (f"{self.bound}: waits {self.wait_share:.1%} of each batch in next() (threshold "
                f"{self.threshold:.0%}, margin {self.margin:+.1%}); starves the device below a step of {crossing}")


def judge(run: steady.Steady, workers: int) -> Verdict:
    """The verdict of a steady-state run of a loader with ``workers`` workers."""
    if run.batches == 0:
        raise ValueError(f"no batch was timed ({run.short or 'empty run'}): there is no verdict to give")
    return Verdict(run.wait_share, run.seconds_per_batch, run.wait_s / run.batches, workers)


def verdict(variant: str, device: str, **sizes: Any) -> Verdict:
    """The verdict of one case, built fresh, timed at steady state (`steady.run`), then closed.

    Args:
        variant: a variant or the floor.
        device: "cpu" or "cuda".
        **sizes: the family's parameters, ``model_ms`` among them.

    Raises:
        SkipCase: the case cannot run here (more workers than cores, no device, no room).
    """
    return read_case(variant, device, sizes, lambda step: judge(steady.run(step), step.prefetching_workers))

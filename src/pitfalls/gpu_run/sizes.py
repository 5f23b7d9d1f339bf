"""How the budgeted run sizes its pieces: the articles' sizes on a GPU (each family's `Family.article_sizes`, the one
place they are written), small sizes that finish in seconds on a CPU rehearsal."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pitfalls.probes.timing import BLOCKED_SECONDS
from pitfalls.registry import family

__all__ = ["ON_GPU", "REHEARSAL", "Sizes"]


@dataclass(frozen=True)
class Sizes:
    """The sizes and effort of the pieces on one kind of device.

    Attributes:
        article: whether these are the articles' sizes (the claims table gives a verdict only then).
        rounds: interleaved rounds of each speedup (block pairs at least, for cases with workers or ranks).
        nvml_seconds: seconds each case loops while NVML samples (the NVML piece).
        busy_seconds: seconds a headline's case loops while NVML reads how busy the GPU is.
        speedup_seconds: seconds a speedup of cases with workers or ranks keeps timing block pairs past ``rounds``.
        host_seconds: seconds the host timer times each case against its CUDA events (at least).
        small: family -> its sizes off the GPU, where its smoke size alone would not show every headline's form.
    """

    article: bool
    rounds: int
    nvml_seconds: float
    busy_seconds: float
    speedup_seconds: float
    host_seconds: float
    small: Mapping[str, tuple[Mapping[str, Any], ...]] = field(default_factory=dict)

    def of(self, name: str) -> tuple[dict[str, Any], ...]:
        """The sizes to measure a family at: its article's, else (a rehearsal) the small ones or its smoke size."""
        entry = family(name)
        if self.article and entry.article_sizes:
            return tuple(dict(s) for s in entry.article_sizes)
        return tuple(dict(s) for s in self.small.get(name, (entry.smoke,)))


ON_GPU = Sizes(article=True, rounds=10, nvml_seconds=3.0, busy_seconds=2.0, speedup_seconds=BLOCKED_SECONDS,
               host_seconds=0.5)
# A rehearsal shows that every piece runs and writes its figures: its speedups take their rounds and no more, its
# host times (no CUDA events to hold them against) a few calls. The sampler's sizes have both of the article's
# forms (one row and a batch of 32 per call); the loader's a worker, so that batches are in flight.
REHEARSAL = Sizes(article=False, rounds=3, nvml_seconds=0.2, busy_seconds=0.2, speedup_seconds=0.0, host_seconds=0.05,
                  small={"sampler": tuple({"n": n, "batch": batch} for batch in (1, 32) for n in (1_000, 10_000)),
                         "loader": ({"image_size": 32, "batch": 4, "items": 8, "num_workers": 1},)})

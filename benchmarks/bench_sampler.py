"""Article 004, the balanced sampler: pick N/10 items, half positive, half negative, per call.

Each class sweeps the family's variants and floor (pitfalls.families.sampler) over its grid, its shape from
benchmarks/common.py; each figure is one delegating line into pitfalls.measure. A batch of 32 is one call for the
static variant and a Python loop over its rows for the nonzero one.
"""

from typing import Any

from pitfalls import measure

from . import common, shapes


class Sample(shapes.Time):
    """One call of the sampler (a batch of rows), synchronized."""

    family = "sampler"

    def time_sample(self, *params: Any) -> None:
        measure.step(self.case)

    def peakmem_sample(self, *params: Any) -> None:
        measure.step(self.case)


class Speedup(shapes.Speedup):
    family = "sampler"

    def track_speedup(self, *params: Any) -> float:
        return common.speedup(self.naive_case, self.case)


class SyncHazards(shapes.SyncHazards):
    """nonzero: two per row (one nonzero for the positives, one for the negatives); static: none."""

    family = "sampler"

    def track_sync_hazards(self, *params: Any) -> int:
        return measure.sync_hazards(self.case)


class Compile(shapes.CompileSweep):
    """Swept over every N of the grid in one process."""

    family = "sampler"
    sweep_axis = "n"

    def setup_cache(self) -> dict[tuple[Any, ...], Any]:
        return self.compile_table()


class Cuda(shapes.Cuda):
    family = "sampler"


class Nvml(shapes.Nvml):
    family = "sampler"

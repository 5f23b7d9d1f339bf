"""Article 000, the masked cross-entropy: one SGD training step of the toy segmentation net per call.

Each class sweeps the family's variants and floor (pitfalls.families.loss) over its grid, its shape from
benchmarks/common.py; each figure is one delegating line into pitfalls.measure.
"""

from typing import Any

from pitfalls import measure

from . import common, shapes


class Step(shapes.Time):
    """One training step (forward, the masked loss, backward, SGD with momentum), synchronized."""

    family = "loss"

    def time_step(self, *params: Any) -> None:
        measure.step(self.case)

    def peakmem_step(self, *params: Any) -> None:
        measure.step(self.case)


class SyncHazards(shapes.SyncHazards):
    """naive: six a step (nonzero, the index assignment's copy of a host value to the device, unique, two boolean
    masks and a masked assignment); ignore_index: none."""

    family = "loss"

    def track_sync_hazards(self, *params: Any) -> int:
        return measure.sync_hazards(self.case)


class Speedup(shapes.Speedup):
    family = "loss"

    def track_speedup(self, *params: Any) -> float:
        return common.speedup(self.naive_case, self.case)


class Compile(shapes.Compile):
    family = "loss"

    def setup_cache(self) -> dict[tuple[Any, ...], Any]:
        return self.compile_table()


class Cuda(shapes.Cuda):
    family = "loss"


class Nvml(shapes.Nvml):
    family = "loss"

"""Article 004, the balanced sampler: pick N/10 items, half positive, half negative, per call.

The classes are the suite's shared figures (benchmarks/common.py) made for the sampler family from its entry
(pitfalls.families.sampler): ``Sample`` (time_sample, peakmem_sample), ``Speedup``, ``SyncHazards``, ``Compile``
(swept over every N of the grid in one process, so it also counts recompiles), ``Cuda`` and ``Nvml``. A batch of
32 is one call for the static variant and a Python loop over rows for the nonzero one.
"""

from . import common

globals().update(common.family_classes("sampler", __name__, time=("Sample", "sample")))

"""Article 000, the masked cross-entropy: one SGD training step of the toy segmentation net per call.

The classes are the suite's shared figures (benchmarks/common.py) made for the loss family from its entry
(pitfalls.families.loss): ``Step`` (time_step, peakmem_step), ``Speedup``, ``SyncHazards``, ``Compile``, ``Cuda``
and ``Nvml``, each sweeping the family's variants and floor over its grid.
"""

from . import common

globals().update(common.family_classes("loss", __name__, time=("Step", "step")))

"""Article 001, multi-GPU training: one SGD step of the toy segmentation net on one global batch, as ``single`` (one
device), ``data_parallel``, ``data_parallel_loss_inside`` and ``ddp`` (ranks kept alive between steps); its modules
are listed in docs/layout.md. What other packages use is re-exported here.
"""

from pitfalls.families.parallel.entry import FAMILY, ParallelFigures, measure_figures
from pitfalls.families.parallel.step import DDP

__all__ = ["DDP", "FAMILY", "ParallelFigures", "measure_figures"]

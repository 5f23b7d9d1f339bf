"""Article 001, multi-GPU training: one SGD step of the toy segmentation net on one global batch, as ``single`` (one
device), ``data_parallel``, ``data_parallel_loss_inside`` and ``ddp`` (ranks kept alive between steps).

The package: `entry` (the family's entry: build, estimate, gate, its own figures), `step` (what each process runs:
the data, the net, the `Trainer`, its timing and memory), `launch` (the ddp ranks as a group) and `rank` (a rank's
command loop), `memory` (the largest global batch that fits, searched on the GPUs), and `checks` (the known answers
of its instruments). What a user calls is re-exported here.
"""

from pitfalls.families.parallel.entry import FAMILY, ParallelFigures, case_figures, measure_figures
from pitfalls.families.parallel.step import DATA_PARALLEL, DATA_PARALLEL_LOSS_INSIDE, DDP, SINGLE, VARIANTS

__all__ = ["DATA_PARALLEL", "DATA_PARALLEL_LOSS_INSIDE", "DDP", "FAMILY", "SINGLE", "VARIANTS", "ParallelFigures",
           "case_figures", "measure_figures"]

"""Article 001, multi-GPU training: one SGD step of the toy segmentation net on one global batch, as ``single`` (one
device), ``data_parallel``, ``data_parallel_loss_inside`` and ``ddp`` (ranks kept alive between steps).

The package: `entry` (the family's entry: build, estimate, gate, its own figures), `step` (what each process runs:
the data, the net, the `Trainer`, its timing and memory), `launch` (the ddp ranks as a group) and `rank` (a rank's
command loop), `memory` (the largest global batch that fits, searched on the GPUs), and `checks` (the known answers
of its instruments). What other packages use is re-exported here.
"""

from pitfalls.families.parallel.entry import FAMILY, ParallelFigures, measure_figures
from pitfalls.families.parallel.step import DDP

__all__ = ["DDP", "FAMILY", "ParallelFigures", "measure_figures"]

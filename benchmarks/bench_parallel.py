"""Article 001, multi-GPU training: one SGD step of the toy segmentation net on the same global batch, as
``single`` (one device), ``data_parallel``, ``data_parallel_loss_inside`` and ``ddp`` (torchrun's ranks).

The shared figures (benchmarks/common.py) made from the family's entry (pitfalls.families.parallel): ``Step``
(time_step; peakmem_step for the variants that run in this process) and ``Speedup`` over ``single``. The family's
own figures are in ``Ranks``, measured once per case in one process (its ``setup_cache``): samples/s, peak memory
of rank 0 and of the others and their ratio, communication time per step, NVML busy % of rank 0's GPU and of the
others. A ddp case starts its ranks in ``setup`` (torchrun, fresh interpreters: nothing forked from this process)
and times steps, not process starts.
"""

from __future__ import annotations

from typing import Any

from pitfalls import registry
from pitfalls.families import parallel
from pitfalls.families.parallel_launch import RankFailed
from pitfalls.family import SkipCase
from pitfalls.probes import Unavailable

from . import common

_shared = common.family_classes("parallel", __name__, time=("Step", "step"))
globals().update(_shared)


# asv's default of 60 s per benchmark process is short for a ddp case on a busy machine: setup starts torchrun and
# its ranks (6 to 10 s on 2 cores), and the speedup runs single's and ddp's steps in turn.
TIMEOUT_S = 600


class Step(_shared["Step"]):  # type: ignore[misc,valid-type]
    __doc__ = _shared["Step"].__doc__
    timeout = TIMEOUT_S

    def peakmem_step(self, *params: Any) -> None:
        # asv reads this process's peak RSS; a ddp step's memory is in its ranks (Ranks.track_peak_memory_*).
        if self.case.variant == parallel.DDP:
            common.figure(Unavailable("the step runs in the rank processes; see Ranks.track_peak_memory_rank0"))
        common.step(self.case)


class Speedup(_shared["Speedup"]):  # type: ignore[misc,valid-type]
    __doc__ = _shared["Speedup"].__doc__
    timeout = TIMEOUT_S


def figures_table(param_names: list[str], params: list[list[Any]]) -> dict[tuple[Any, ...], Any]:
    """Every parameter set's `parallel.ParallelFigures`, built, measured and closed one after the other in one
    process; the reason in their place for a case that cannot run here, the error for one that failed."""
    table: dict[tuple[Any, ...], Any] = {}
    for values, variant, device, args in common.parameter_sets(param_names, params):
        try:
            with registry.family("parallel").build(variant, device=device, **args) as case:
                table[values] = parallel.measure_figures(case, nvml_seconds=common.NVML_WINDOW_S)
        except SkipCase as skip:
            table[values] = skip.reason
        except RankFailed as error:  # this case fails alone; the other cases are still measured
            table[values] = error
    return table


class Ranks(common._FamilyBenchmark):
    """Per-rank figures of one step: samples/s, peak memory (rank 0, the others, their ratio), communication,
    NVML busy % (rank 0's GPU, the others'). Memory is CUDA max allocated on GPUs and the process's USS at the end of
    the forward on the CPU; a DataParallel case's ranks are its devices."""

    family = "parallel"
    mode_axis = False
    timeout = 3600
    units = {
        "track_samples_per_second": "samples/s",
        "track_peak_memory_rank0": "bytes",
        "track_peak_memory_others": "bytes",
        "track_memory_imbalance": "x",
        "track_communication": "seconds",
        "track_busy_rank0": "%",
        "track_busy_others": "%",
    }

    def setup_cache(self) -> dict[tuple[Any, ...], Any]:
        return figures_table(self.param_names, self.params)  # type: ignore[attr-defined]

    def setup(self, table: dict[tuple[Any, ...], Any], *params: Any) -> None:
        figures = table[tuple(params)]
        if isinstance(figures, str):
            common.skip(figures)
        if isinstance(figures, Exception):
            raise figures
        self.figures: parallel.ParallelFigures = figures

    def track_samples_per_second(self, table: Any, *params: Any) -> float:
        return self.figures.samples_per_s

    def track_peak_memory_rank0(self, table: Any, *params: Any) -> int:
        return self.figures.rank0_memory()

    def track_peak_memory_others(self, table: Any, *params: Any) -> float:
        return common.figure(self.figures.others_memory())

    def track_memory_imbalance(self, table: Any, *params: Any) -> float:
        return common.figure(self.figures.memory_imbalance())

    def track_communication(self, table: Any, *params: Any) -> float:
        return common.figure(self.figures.communication_s)

    def track_busy_rank0(self, table: Any, *params: Any) -> float:
        return common.figure(self.figures.rank0_busy())

    def track_busy_others(self, table: Any, *params: Any) -> float:
        return common.figure(self.figures.others_busy())

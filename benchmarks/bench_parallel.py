"""Article 001, multi-GPU training: one SGD step of the toy segmentation net on the same global batch, as
``single`` (one device), ``data_parallel``, ``data_parallel_loss_inside`` and ``ddp`` (ranks kept alive).

Every time here comes from one routine (`pitfalls.distributed.time_steps`): each process times N synchronized
steps after a barrier and the step is the slowest process's median, for every variant; a ddp rank times its own
steps, so no control round trip is timed. ``Step.track_step_time`` is that time, ``Speedup.track_speedup`` the
ratio of such blocks timed A B A B, and ``Ranks`` the family's own figures, measured once per case in one process
(its ``setup_cache``): samples/s (from the same routine), peak memory of rank 0 and of the others and their
ratio, communication per step (in flight, from the profiler; exposed, the step minus the same step under
``no_sync()``), ddp's weak-scaling efficiency (samples/s of W ranks over W times one rank's), NVML busy % of rank
0's GPU and of the others. A figure that fails reads n/a with the error; the others are still measured.
"""

from typing import Any

from pitfalls import measure
from pitfalls.families.parallel import entry as parallel
from pitfalls.probes import Unavailable

from . import common, shapes

# Timeouts nest: a rank command (pitfalls.distributed.launch.STEP_TIMEOUT_S, 120 s) < the ranks' process group
# (240 s) < asv's benchmark timeout, so a hang ends as RankFailed with the hung rank's stack, not as asv's kill.
TIMEOUT_S = 600
# Steps per block of the speedup (A B A B, 5 block pairs at least, more within the routine's budget of seconds):
# fewer than the figures' 10, to keep the family's share of the quick grid near its 2.5 minutes; the same routine.
SPEEDUP_STEPS = 5
# A series that ended: a ddp "step" timed as a control round trip is not measured any more.
RETIRED = ("bench_parallel.Step.time_step",)


class Step(common.FamilyBenchmark):
    """Seconds per step: every process times `parallel.FIGURE_STEPS` steps after a barrier; the slowest process's
    median (ddp: in the ranks; the other variants: in this process, with the same routine). Host peak memory of a
    step for the variants that run in this process."""

    family = "parallel"
    mode_axis = False
    timeout = TIMEOUT_S
    units = {"track_step_time": "seconds"}

    def setup(self, *params: Any) -> None:
        self.case = self.build(params)

    def track_step_time(self, *params: Any) -> float:
        return common.figure(parallel.figure(lambda: self.case.block(parallel.FIGURE_STEPS)))

    def peakmem_step(self, *params: Any) -> None:
        # asv reads this process's peak RSS; a ddp step's memory is in its ranks, a DataParallel one's on GPU 0.
        if self.case.variant == parallel.DDP:
            common.figure(Unavailable("the step runs in the rank processes; see Ranks.track_peak_memory_rank0"))
        if self.case.variant in (parallel.DATA_PARALLEL, parallel.DATA_PARALLEL_LOSS_INSIDE):
            common.figure(Unavailable("host memory says nothing of GPU 0's; see Ranks.track_peak_memory_rank0"))
        measure.step(self.case)


class Speedup(shapes.Speedup):
    family = "parallel"
    timeout = TIMEOUT_S

    def track_speedup(self, *params: Any) -> float:
        return common.speedup(self.naive_case, self.case, calls=SPEEDUP_STEPS)


def one_rank_key(case: dict[str, Any]) -> tuple[Any, ...]:
    """The `Ranks` table's key of the same case at one rank (the reference of ddp's weak scaling)."""
    return tuple(1 if name == "world_size" else value for name, value in case.items())


class Ranks(common.FamilyBenchmark):
    """Per-rank figures of one step: samples/s, peak memory (rank 0, the others, their ratio), communication,
    NVML busy % (rank 0's GPU, the others'). Memory is CUDA max allocated on GPUs and torch's allocations at the step's
    peak on the CPU; a DataParallel case's ranks are its devices."""

    family = "parallel"
    mode_axis = False
    timeout = 3600
    units = {"track_samples_per_second": "samples/s", "track_peak_memory_rank0": "bytes",
             "track_peak_memory_others": "bytes", "track_memory_imbalance": "x", "track_communication": "seconds",
             "track_exposed_communication": "seconds", "track_scaling_efficiency": "x", "track_busy_rank0": "%",
             "track_busy_others": "%"}

    def setup_cache(self) -> dict[tuple[Any, ...], Any]:
        return measure.case_table(parallel.case_figures, self.param_names, self.params)  # type: ignore[attr-defined]

    def setup(self, table: dict[tuple[Any, ...], Any], *params: Any) -> None:
        with common.skipping():
            self.figures: parallel.ParallelFigures = measure.lookup(table, params)

    def track_samples_per_second(self, table: Any, *params: Any) -> float:
        return common.figure(self.figures.samples_per_s)

    def track_peak_memory_rank0(self, table: Any, *params: Any) -> float:
        return common.figure(self.figures.rank0_memory())

    def track_peak_memory_others(self, table: Any, *params: Any) -> float:
        return common.figure(self.figures.others_memory())

    def track_memory_imbalance(self, table: Any, *params: Any) -> float:
        return common.figure(self.figures.memory_imbalance())

    def track_communication(self, table: Any, *params: Any) -> float:
        return common.figure(self.figures.communication_s)

    def track_exposed_communication(self, table: Any, *params: Any) -> float:
        return common.figure(self.figures.exposed_communication_s)

    def track_scaling_efficiency(self, table: Any, *params: Any) -> float:
        case = dict(zip(self.param_names, params, strict=True))  # type: ignore[attr-defined]
        return common.figure(parallel.scaling_efficiency(case["variant"], int(case["world_size"]), self.figures,
                                                         table.get(one_rank_key(case))))

    def track_busy_rank0(self, table: Any, *params: Any) -> float:
        return common.figure(self.figures.rank0_busy())

    def track_busy_others(self, table: Any, *params: Any) -> float:
        return common.figure(self.figures.others_busy())

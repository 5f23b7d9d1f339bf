"""Article 001, multi-GPU training: ``nn.DataParallel`` gathers every output on the first GPU; DDP does not.

One call of a case is one SGD(lr=1e-3, momentum=0.9) training step of the loss family's `SegNet` with its
``ignore_index`` loss, on the same global batch (``world_size * batch`` seeded images) for every variant:

============================= ========================================================================
variant                       how the global batch is trained
============================= ========================================================================
single                        one process, one device, the whole global batch
data_parallel                 ``nn.DataParallel`` over ``world_size`` GPUs; the logits of every replica
                              are gathered on GPU 0, which computes the loss alone (the article's pitfall)
data_parallel_loss_inside     the article's first fix: the loss is computed inside each replica's
                              forward, so only one scalar per replica returns to GPU 0
ddp                           ``DistributedDataParallel``, one process per device started by ``torchrun``
                              (`parallel_launch`, `parallel_rank`); gloo on the CPU, nccl on GPUs
============================= ========================================================================

Why ``single`` comes first and there is no floor: the suite reads the first variant as the reference of the
equivalence gate and the baseline of the speedup. Here that is the one-device step on the same global batch,
which is also what a floor would be (the same job on the hardware one device has), so a separate floor case
would only repeat it. The speedup of each variant over ``single`` is then its scaling over one device.

Same step, not a similar one. A replica (or rank) divides its loss by its own number of valid pixels, and
DataParallel and DDP average the replicas; that equals the whole batch's mean only when every replica holds the
same number of valid pixels. The family's images therefore all hold exactly the same number of ignored pixels
(-1 and the background class, each ``pixels // (C + 1)``, the share ``randint(-1, C)`` would give): every
variant then computes the same loss and gradient as ``single``, and the gate compares updated weights.

Figures. Beyond time per step and the speedup over ``single``: samples/s, peak memory per rank (CUDA max
allocated on GPUs; on the CPU the rank process's USS at the end of the forward, when every activation is alive),
rank 0 against the others (the article's unbalanced memory), time in communication per step from the profiler
(gloo's collectives on the CPU; nccl kernels and peer copies on GPUs), and NVML busy % per GPU (the article's
"the other GPUs cool down waiting"). There is nothing to ``torch.compile`` across processes, and the suite's
sync-hazard and CUDA-sync counters see only their own process, so those shared figures do not apply.

What each process runs (the data, the net, the `Trainer`) is in `parallel_step`; this module holds the entry, the
devices, the family's own figures and the gate.

Devices. ``data_parallel*`` need 2 or more CUDA devices; a case asking for more ranks than the machine has
devices (GPUs, or CPU cores for gloo ranks with their own threads) is skipped with the reason, before any process
starts.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, cast

import torch
from torch import Tensor

from pitfalls.families.loss import estimate_train_step_bytes
from pitfalls.families.parallel_launch import RankFailed, RankGroup
from pitfalls.families.parallel_step import (
    DATA_PARALLEL,
    DATA_PARALLEL_LOSS_INSIDE,
    DDP,
    NEEDS_GPUS,
    SINGLE,
    VARIANTS,
    RankFigures,
    StepConfig,
    Trainer,
    initial_net,
    make_trainer,
    synchronize_all,
    utilization,
)
from pitfalls.family import SPEEDUP, TIME, Case, Comparison, Family, OwnFigure, Param, SkipCase
from pitfalls.probes.nvml import NvmlSampler
from pitfalls.probes.result import Unavailable
from pitfalls.probes.timing import wall_time


class Runner(Protocol):
    """What a case of this family calls: a `Trainer` in this process, or a `parallel_launch.RankGroup`."""

    def __call__(self) -> Any: ...

    def measure(self) -> list[RankFigures]: ...

    def communication(self) -> float | Unavailable: ...

    def state(self) -> dict[str, Tensor]: ...

    def close(self) -> None: ...


def usable_cpus() -> int:
    """CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def check_devices(variant: str, device: torch.device, world_size: int) -> None:
    """Raise `SkipCase` with the reason when this machine cannot run the case; nothing is started before."""
    if variant in (DATA_PARALLEL, DATA_PARALLEL_LOSS_INSIDE):
        count = torch.cuda.device_count() if device.type == "cuda" else 0
        if count < 2:
            raise SkipCase(f"{variant} {NEEDS_GPUS} (nn.DataParallel); this machine has {count}")
    if variant == SINGLE:
        return
    if device.type == "cuda":
        count = torch.cuda.device_count()
        if world_size > count:
            raise SkipCase(f"world_size={world_size} needs {world_size} CUDA devices; this machine has {count}")
    elif world_size > usable_cpus():
        raise SkipCase(f"world_size={world_size} needs {world_size} CPU cores (one gloo rank each); "
                       f"this process may use {usable_cpus()}")


def rank_threads(world_size: int) -> int:
    """Intra-op threads of each gloo rank: the cores shared out, at least one."""
    return max(1, usable_cpus() // world_size)


# --- the family's own figures -----------------------------------------------------------------------------------

WARMUP_CALLS = 2


@dataclass(frozen=True)
class ParallelFigures:
    """The family's own figures of one case (besides asv's time per step and the speedup over ``single``).

    Attributes:
        step_s: median seconds per step, timed around calls in the benchmark process (torch.utils.benchmark).
        samples_per_s: the global batch over ``step_s``.
        ranks: each rank's (device's) time and peak memory over one step, rank 0 first.
        communication_s: seconds of one profiled step in which communication was in flight, averaged over the
            processes.
        busy_pct: NVML's GPU utilization per device, rank 0 first, while the case loops; GPUs only.
    """

    step_s: float
    samples_per_s: float
    ranks: tuple[RankFigures, ...]
    communication_s: float | Unavailable
    busy_pct: tuple[float, ...] | Unavailable

    def rank0_memory(self) -> int:
        return self.ranks[0].peak_bytes

    def others_memory(self) -> float | Unavailable:
        """Mean peak memory of the ranks other than rank 0."""
        others = [r.peak_bytes for r in self.ranks[1:]]
        return sum(others) / len(others) if others else Unavailable("one rank: no other rank to compare")

    def memory_imbalance(self) -> float | Unavailable:
        """Rank 0's peak memory over the others' mean (1 = balanced; DataParallel's GPU 0 holds more)."""
        others = self.others_memory()
        return others if isinstance(others, Unavailable) else self.ranks[0].peak_bytes / others

    def rank0_busy(self) -> float | Unavailable:
        return self.busy_pct if isinstance(self.busy_pct, Unavailable) else self.busy_pct[0]

    def others_busy(self) -> float | Unavailable:
        """Mean NVML busy % of the devices other than rank 0's."""
        if isinstance(self.busy_pct, Unavailable):
            return self.busy_pct
        others = self.busy_pct[1:]
        return sum(others) / len(others) if others else Unavailable("one rank: no other device to compare")


def case_devices(case: Case) -> list[torch.device]:
    """The devices a case's step runs on, rank 0's first."""
    if case.variant == SINGLE or case.device.type != "cuda":
        return [case.device]
    return [torch.device("cuda", i) for i in range(int(case.params["world_size"]))]


def busy_per_device(case: Case, seconds: float) -> tuple[float, ...] | Unavailable:
    """NVML's GPU utilization (mean %) of each of the case's devices while it loops for ``seconds``."""
    if case.device.type != "cuda":
        return Unavailable(f"case runs on {case.device}: no GPU for NVML to read")
    devices = case_devices(case)
    with contextlib.ExitStack() as stack:
        samplers = [stack.enter_context(NvmlSampler(device)) for device in devices]
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            case()
        synchronize_all(devices)
    busy = []
    for sampler in samplers:
        mean = utilization(sampler.summary)
        if isinstance(mean, Unavailable):
            return mean
        busy.append(mean)
    return tuple(busy)


def measure_figures(case: Case, *, min_run_time: float = 1.0, nvml_seconds: float = 2.0) -> ParallelFigures:
    """Measure a built case's own figures: samples/s, each rank's memory, communication, NVML busy per GPU.

    Args:
        case: a case of this family (it is warmed up first).
        min_run_time: seconds torch.utils.benchmark spends timing steps.
        nvml_seconds: seconds the case loops while NVML samples each GPU (GPUs only).
    """
    runner = cast(Runner, case.call)
    devices = case_devices(case)

    def step() -> None:
        runner()
        synchronize_all(devices)

    timing = wall_time(step, warmup=WARMUP_CALLS, min_run_time=min_run_time)
    global_batch = int(case.params["world_size"]) * int(case.params["batch"])
    return ParallelFigures(
        step_s=timing.median_s,
        samples_per_s=global_batch / timing.median_s,
        ranks=tuple(runner.measure()),
        communication_s=runner.communication(),
        busy_pct=busy_per_device(case, nvml_seconds),
    )


def make_runner(variant: str, device: torch.device, config: StepConfig) -> Runner:
    """What a case of a variant calls: a `Trainer` here, or for ddp a `parallel_launch.RankGroup` whose ranks are
    started now. Raises `SkipCase` first when this machine cannot run it."""
    check_devices(variant, device, config.world_size)
    if variant == DDP:
        return RankGroup(config, device.type, threads=rank_threads(config.world_size))
    return make_trainer(variant, device, config)


def build(variant: str, device: torch.device, compiled: bool, params: dict[str, Any]) -> Case:
    """One training step of a variant as a case; ddp's ranks are started here and stopped by ``close``."""
    runner = make_runner(variant, device, StepConfig(**params))
    if isinstance(runner, Trainer):
        return Case(FAMILY.name, variant, device, compiled, params, runner, runner.forward,
                    (runner.images, runner.labels))
    return Case(FAMILY.name, variant, device, compiled, params, runner, close=runner.close)


def estimate(params: Mapping[str, Any]) -> int:
    """The most any one device holds: the whole global batch's step, as ``single`` runs it (DataParallel's GPU 0
    and every DDP rank hold less)."""
    return estimate_train_step_bytes(params["world_size"] * params["batch"], params["image_size"])


# --- the equivalence gate ---------------------------------------------------------------------------------------

# The gate runs the step in float64, so that it compares the step's mathematics (which images, which mean, which
# average) and not float32's reduction order: summed per rank then averaged, float32 gradients over 2 x 4 images of
# 64x64 differ from the whole batch's by up to 2e-4 of the largest update (the background logit's bias sums 32768
# pixels). In float64 a variant's update and ``single``'s differ by at most 1e-15 of the largest update (measured on
# the CPU with 2 gloo ranks, up to 4 images of 64x64 each); a rank training on another rank's images, by far more
# (tests/test_parallel.py).
GATE_DTYPE = "float64"
UPDATE_RTOL = 1e-9


def one_step_update(runner: Runner, config: StepConfig) -> dict[str, Tensor]:
    """Run one step and return how much it moved each weight (new minus initial)."""
    initial = initial_net(config).state_dict()
    runner()
    return {name: value - initial[name] for name, value in runner.state().items()}


def compare_updates(got: Mapping[str, Tensor], want: Mapping[str, Tensor]) -> tuple[float, list[str]]:
    """The largest difference between two steps' updates, and the weights whose update differs by more than
    ``UPDATE_RTOL`` of the largest update."""
    scale = max(float(w.abs().max()) for w in want.values())
    worst = max(float((got[name] - w).abs().max()) for name, w in want.items())
    differing = [name for name, w in want.items() if not torch.allclose(got[name], w, rtol=0, atol=UPDATE_RTOL * scale)]
    return worst, differing


def compare(family: Family, variant: str, device: torch.device) -> Comparison:
    """One step of a variant against one step of ``single`` on the same global batch: the updated weights.

    At the smoke size with 2 ranks (on a machine with one GPU, ddp runs 1 rank), in float64 (`GATE_DTYPE`).
    A variant this machine cannot run is a `Comparison.not_run` with the reason.
    """
    params = dict(family.smoke)
    if device.type == "cuda" and variant == DDP:
        params["world_size"] = max(1, min(params["world_size"], torch.cuda.device_count()))
    config = StepConfig(**params, dtype=GATE_DTYPE)
    try:
        runner = make_runner(variant, device, config)
        try:
            got = one_step_update(runner, config)
        finally:
            runner.close()
    except SkipCase as skip:
        return Comparison.not_run(family.name, variant, str(device), skip.reason)
    except RankFailed as failure:
        # A rank's error fails the gate like a wrong answer: its first line and its exception's line.
        lines = str(failure).split("\n--- torchrun output")[0].strip().splitlines()
        return Comparison(family.name, variant, str(device), False, float("inf"), f"{lines[0]} {lines[-1]}")
    worst, differing = compare_updates(got, one_step_update(make_trainer(SINGLE, device, config), config))
    detail = f"updates differ in {', '.join(differing)}" if differing else ""
    return Comparison(family.name, variant, str(device), not differing, worst, detail)


def own_figures(case: Case) -> list[OwnFigure]:
    """The family's own figures of a built case, for ``pitfalls probe`` (bench_parallel.Ranks has the same)."""
    figures = measure_figures(case)
    return [
        ("samples per second", figures.samples_per_s, "samples/s", "the global batch over the median step"),
        ("peak memory, rank 0", figures.rank0_memory() / 2**20, "MiB",
         "CUDA max allocated on a GPU; USS at the end of the forward on the CPU"),
        ("peak memory, other ranks", _mib(figures.others_memory()), "MiB", "their mean"),
        ("memory imbalance", figures.memory_imbalance(), "x",
         "rank 0 over the others (DataParallel: GPU 0 holds more)"),
        ("communication per step", figures.communication_s, "s", "profiled; averaged over the processes"),
        ("GPU busy, rank 0", figures.rank0_busy(), "%", "NVML"),
        ("GPU busy, other ranks", figures.others_busy(), "%", "NVML: the article's \"others cool down waiting\""),
    ]


def _mib(value: float | Unavailable) -> float | Unavailable:
    return value if isinstance(value, Unavailable) else value / 2**20


FAMILY = Family(
    name="parallel",
    article="001",
    summary="multi-GPU step: DataParallel gathers every output on GPU 0; the loss inside the replicas, or DDP",
    variants=VARIANTS,
    params=(
        Param("world_size", 2, "ranks (ddp processes or data_parallel replicas) sharing the global batch"),
        Param("batch", 4, "images per rank; the global batch is world_size * batch"),
        Param("image_size", 64, "image height and width, in pixels", minimum=4),
    ),
    builder=build,
    estimate=estimate,
    comparer=compare,
    smoke={"world_size": 2, "batch": 2, "image_size": 16},
    grids={
        "quick": {"world_size": (1, 2), "batch": (4,), "image_size": (64,)},
        # Up to 8 GPUs; a machine with fewer reads n/a for the larger world sizes.
        "full": {"world_size": (1, 2, 4, 8), "batch": (4, 8, 32), "image_size": (64, 512)},
    },
    # The article: 4 GPUs, a global batch of 32 (8 per GPU), 512x512 images.
    article_sizes=({"world_size": 4, "batch": 8, "image_size": 512},),
    figures=frozenset({TIME, SPEEDUP}),
    unit="step",
    floor=False,
    own_figures=own_figures,
)

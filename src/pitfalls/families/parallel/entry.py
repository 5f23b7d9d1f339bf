"""Article 001, multi-GPU training: ``nn.DataParallel`` gathers every output on the first GPU; DDP does not.

The family's entry: its devices (a case this machine cannot run is skipped before any process starts), the memory
each device holds, its own figures (samples/s, each rank's memory, communication, NVML busy %) and the gate. What
each process runs is in `step`, the ddp ranks in `launch` and `rank`. The variants, why ``single`` comes first
with no floor, why every image holds as many ignored pixels and what each figure reads: docs/families/parallel.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar, cast

import torch
from torch import Tensor

from pitfalls.devices import fits
from pitfalls.families.loss import estimate_train_step_bytes
from pitfalls.families.parallel.checks import (
    CHECKS,
    EXPOSED_FIGURE,
    IMBALANCE_FIGURE,
    IN_FLIGHT_FIGURE,
    OTHERS_MEMORY_FIGURE,
    RANK0_MEMORY_FIGURE,
    SAMPLES_PER_SECOND_FIGURE,
    SCALING_FIGURE,
    STEP_TIME_FIGURE,
)
from pitfalls.families.parallel.launch import DdpGroup, RankFailed
from pitfalls.families.parallel.step import (
    DATA_PARALLEL,
    DATA_PARALLEL_LOSS_INSIDE,
    DDP,
    MODELS,
    NEEDS_GPUS,
    NUM_CLASSES,
    SEGNET,
    SINGLE,
    STEP_PEAK,
    VARIANTS,
    ParallelFigures,
    Shard,
    StepConfig,
    Trainer,
    initial_net,
    make_trainer,
    parameter_count,
    per_second,
    seeded_images,
    utilization,
)
from pitfalls.families.parallel.step import (
    scaling_efficiency as scaling_efficiency,  # the benchmarks' weak scaling, with the family's figures
)
from pitfalls.family import SPEEDUP, TIME, Case, Comparison, Family, OwnFigure, Param, SkipCase
from pitfalls.probes.nvml import nvml_windows
from pitfalls.result import Unavailable

# What a case of this family calls: a `Trainer` in this process, or the ranks of a `launch.DdpGroup`.
Runner = Trainer | DdpGroup


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


# --- the family's own figures -----------------------------------------------------------------------------------

# Steps each process times for the family's own figures (samples/s): the same routine as the speedup's blocks.
FIGURE_STEPS = 10


def busy_per_device(case: Case, seconds: float) -> tuple[float, ...] | Unavailable:
    """NVML's GPU utilization (mean %) of each of the case's devices while it loops for ``seconds``."""
    if case.device.type != "cuda":
        return Unavailable(f"case runs on {case.device}: no GPU for NVML to read")
    # The devices the step runs on, rank 0's first.
    devices = [torch.device("cuda", i) for i in range(int(case.params["world_size"]))]
    busy = []
    for summary in nvml_windows(case, [case.device] if case.variant == SINGLE else devices, seconds):
        mean = utilization(summary)
        if isinstance(mean, Unavailable):
            return mean
        busy.append(mean)
    return tuple(busy)


def measure_figures(case: Case, *, steps: int = FIGURE_STEPS, nvml_seconds: float = 2.0) -> ParallelFigures:
    """Measure a built case's own figures: samples/s, each rank's memory, communication, NVML busy per GPU.

    Args:
        case: a case of this family.
        steps: steps each process times (`Trainer.block`, `DdpGroup.block`: the routine of the speedup too).
        nvml_seconds: seconds the case loops while NVML samples each GPU (GPUs only).
    """
    runner = cast(Runner, case.call)
    step_s = figure(lambda: runner.block(steps))
    global_batch = int(case.params["world_size"]) * int(case.params["batch"])
    return ParallelFigures(
        step_s=step_s,
        samples_per_s=per_second(step_s, global_batch),
        ranks=figure(lambda: tuple(runner.measure())),
        communication_s=figure(runner.communication),
        busy_pct=figure(lambda: busy_per_device(case, nvml_seconds)),
        exposed_communication_s=figure(lambda: exposed_communication(runner, steps)),
    )


def exposed_communication(runner: Runner, steps: int) -> float | Unavailable:
    """What communication costs a step (ddp): its step time minus that of the same step without the all-reduce."""
    if not isinstance(runner, DdpGroup):
        return Unavailable("no DDP all-reduce to leave out: measured for ddp only")
    return runner.exposed_communication(steps)


T = TypeVar("T")


def figure(measure: Callable[[], T | Unavailable]) -> T | Unavailable:
    """One figure, or n/a with the error that stopped it: one figure's failure (a rank that raised or hung) is
    reported in its place, and the other figures are still measured (those of a stopped group say so)."""
    try:
        return measure()
    except (RankFailed, RuntimeError, OSError, ValueError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        return Unavailable(f"failed: {type(error).__name__}: {first}")


def make_runner(variant: str, device: torch.device, config: StepConfig) -> Runner:
    """What a case of a variant calls: a `Trainer` here, or for ddp a `launch.DdpGroup` whose ranks are
    started now. Raises `SkipCase` first when this machine cannot run it (no devices, or no memory for it)."""
    check_devices(variant, device, config.world_size)
    check_memory(variant, device, config)
    if variant == DDP:
        return DdpGroup(config, device.type)
    return make_trainer(variant, device, config)


def build(variant: str, device: torch.device, compiled: bool, params: dict[str, Any]) -> Case:
    """One training step of a variant as a case; ddp's ranks are started here and stopped by ``close``."""
    runner = make_runner(variant, device, StepConfig(**params))
    if isinstance(runner, Trainer):
        return Case(FAMILY.name, variant, device, compiled, params, runner, runner.forward,
                    (runner.images, runner.labels), block=runner.block)
    return Case(FAMILY.name, variant, device, compiled, params, runner, close=runner.close, block=runner.block)


# --- memory: what each device holds -----------------------------------------------------------------------------

# Bytes per pixel of what DataParallel gathers on device 0 and the loss makes of it: the gathered float32 logits,
# the loss's log-softmax of them, and their gradient in backward (C channels each).
_GATHERED_COPIES = 3


# Copies of the parameters a device holds in a step: the weights, their gradients, SGD's momentum, and DDP's
# gradient buckets (a DataParallel replica holds the broadcast weights and its gradients instead).
_PARAMETER_COPIES = 4


def device_estimates(variant: str, params: Mapping[str, Any]) -> tuple[int, ...]:
    """Peak bytes of the step on each device, device 0 first, before anything is allocated.

    ``single`` holds the whole global batch on one device; a ``ddp`` rank holds its 1/W; a DataParallel replica
    holds its 1/W, and device 0 also the gathered outputs of the whole global batch, their loss and its gradient
    (``data_parallel``), or one scalar per replica (``data_parallel_loss_inside``). Every device also holds
    `_PARAMETER_COPIES` copies of the net's float32 parameters.
    """
    world, batch, size = int(params["world_size"]), int(params["batch"]), int(params["image_size"])
    weights = _PARAMETER_COPIES * 4 * parameter_count(str(params.get("model", SEGNET)))
    share = estimate_train_step_bytes(batch, size) + weights
    if variant == SINGLE:
        return (estimate_train_step_bytes(world * batch, size) + weights,)
    if variant == DATA_PARALLEL:
        gathered = _GATHERED_COPIES * 4 * NUM_CLASSES * world * batch * size * size
        return (share + gathered,) + (share,) * (world - 1)
    return (share,) * world


# While False, cases are built without the memory estimate's refusal (`estimates_off`).
_ESTIMATE_REFUSES = [True]


@contextlib.contextmanager
def estimates_off() -> Iterator[None]:
    """Build cases without the memory estimate's refusal, so that what fits is measured, not estimated (the
    largest-batch search: an out-of-memory error is its answer)."""
    _ESTIMATE_REFUSES.append(False)
    try:
        yield
    finally:
        _ESTIMATE_REFUSES.pop()


def check_memory(variant: str, device: torch.device, config: StepConfig) -> None:
    """Raise `SkipCase` when a device of the case would not hold its share (all of them on the host, for ranks
    that share its memory)."""
    if not _ESTIMATE_REFUSES[-1]:
        return
    needs = device_estimates(variant, dataclasses.asdict(config))
    if device.type == "cuda":
        held = [(torch.device("cuda", index), needed) for index, needed in enumerate(needs)]
    else:
        held = [(device, sum(needs))]
    for where, needed in held:
        ok, reason = fits(where, needed)
        if not ok:
            raise SkipCase(f"{variant}: {reason}")


def estimate(params: Mapping[str, Any]) -> int:
    """The least one device holds for any variant (one rank's share): the family's coarse check before build;
    each variant's own per-device estimate (`device_estimates`) is checked when it is built."""
    return min(min(device_estimates(variant, params)) for variant in VARIANTS)


# --- the equivalence gate ---------------------------------------------------------------------------------------

# The gate runs the step in float64, so that it compares the step's mathematics (which images, which mean, which
# average) and not float32's reduction order: summed per rank then averaged, float32 gradients over 2 x 4 images of
# 64x64 differ from the whole batch's by up to 2e-4 of the largest update (the background logit's bias sums 32768
# pixels). In float64 a variant's update and ``single``'s differ by at most 1e-15 of the largest update (measured on
# the CPU with 2 gloo ranks, up to 4 images of 64x64 each); a rank training on another rank's images, by far more
# (tests/test_parallel.py).
GATE_DTYPE = "float64"
UPDATE_RTOL = 1e-9


GATE_STEPS = 2  # the second step is the first to use the momentum buffer


def updates_after(runner: Runner, config: StepConfig, steps: int = GATE_STEPS) -> list[dict[str, Tensor]]:
    """Run ``steps`` steps; return each process's (each rank's) weights moved from the initial ones and its
    momentum buffers, rank 0 first."""
    initial = {f"net.{name}": value for name, value in initial_net(config).state_dict().items()}
    for _ in range(steps):
        runner()
    states = [runner.full_state()] if isinstance(runner, Trainer) else runner.states()
    return [{name: value - initial[name] if name in initial else value for name, value in state.items()}
            for state in states]


def compare_updates(got: Mapping[str, Tensor], want: Mapping[str, Tensor]) -> tuple[float, list[str]]:
    """The largest difference between two steps' updates, and the weights whose update differs by more than
    ``UPDATE_RTOL`` of the largest update (a weight missing from ``got`` differs)."""
    scale = max(float(w.abs().max()) for w in want.values())
    worst = max(float((got[name] - w).abs().max()) if name in got else math.inf for name, w in want.items())
    differing = [name for name, w in want.items()
                 if name not in got or not torch.allclose(got[name], w, rtol=0, atol=UPDATE_RTOL * scale)]
    return worst, differing


def check_shards(shards: Sequence[Shard], config: StepConfig) -> list[str]:
    """What is wrong with the samples the ranks trained on: the shards must tile the global batch, in order,
    without overlap, and each hold the images of its range (checksum recomputed from the global batch).

    Returns:
        One line per fault; empty when the shards tile the batch.
    """
    faults = []
    covered = [0] * config.global_batch
    for rank, shard in enumerate(shards):
        if shard.first < 0 or shard.count < 1 or shard.first + shard.count > config.global_batch:
            faults.append(f"rank {rank} trained on images {shard.first}..{shard.first + shard.count - 1}, "
                          f"outside the global batch of {config.global_batch}")
            continue
        for index in range(shard.first, shard.first + shard.count):
            covered[index] += 1
        images, _ = seeded_images(shard.first, shard.count, config.image_size, config.num_classes, config.seed)
        want = Shard.of(shard.first, images.to(config.torch_dtype)).checksum
        if not math.isclose(shard.checksum, want, rel_tol=1e-9, abs_tol=1e-6):
            faults.append(f"rank {rank}'s images are not images {shard.first}..{shard.first + shard.count - 1} "
                          f"(checksum {shard.checksum:.6g}, want {want:.6g})")
    overlap = [i for i, n in enumerate(covered) if n > 1]
    skipped = [i for i, n in enumerate(covered) if n == 0]
    if overlap:
        faults.append(f"images {overlap} were trained on by more than one rank")
    if skipped:
        faults.append(f"images {skipped} were trained on by no rank")
    return faults


def compare(family: Family, variant: str, device: torch.device) -> Comparison:
    """Two steps of a variant against two steps of ``single`` on the same global batch: every rank's weights and
    momentum buffers, and (ddp) which samples each rank trained on.

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
            got = updates_after(runner, config)
            shards = [runner.shard] if isinstance(runner, Trainer) else runner.shards()
        finally:
            runner.close()
    except SkipCase as skip:
        return Comparison.not_run(family.name, variant, str(device), skip.reason)
    except RankFailed as failure:
        # A rank's error fails the gate like a wrong answer: its first line and its last.
        lines = str(failure).split("\n--- rank")[0].strip().splitlines()
        return Comparison(family.name, variant, str(device), False, float("inf"), f"{lines[0]} {lines[-1]}")
    [want] = updates_after(make_trainer(SINGLE, device, config), config)
    faults = check_shards(shards, config)
    worst = 0.0
    for rank, state in enumerate(got):
        rank_worst, differing = compare_updates(state, want)
        worst = max(worst, rank_worst)
        if differing:
            faults.append(f"rank {rank}: updates differ in {', '.join(differing)}")
    return Comparison(family.name, variant, str(device), not faults, worst, "; ".join(faults))


def own_figures(case: Case) -> list[OwnFigure]:
    """The family's own figures of a built case, for ``pitfalls probe`` (bench_parallel.Ranks has the same)."""
    figures = measure_figures(case)
    return [
        (STEP_TIME_FIGURE, _scaled(figures.step_s, 1e3), "ms",
         f"the slowest process's median of {FIGURE_STEPS} steps timed in it"),
        (SAMPLES_PER_SECOND_FIGURE, figures.samples_per_s, "samples/s", "the global batch over the step time"),
        (RANK0_MEMORY_FIGURE, _scaled(figures.rank0_memory(), 2**-20), "MiB",
         f"CUDA max allocated on a GPU; on the CPU the {STEP_PEAK}, above its start (torch.profiler)"),
        (OTHERS_MEMORY_FIGURE, _scaled(figures.others_memory(), 2**-20), "MiB", "their mean"),
        (IMBALANCE_FIGURE, figures.memory_imbalance(), "x",
         "rank 0 over the others (DataParallel: GPU 0 holds more)"),
        (IN_FLIGHT_FIGURE, figures.communication_s, "s",
         "profiled; averaged over the processes; includes waiting for a peer and what overlaps the backward"),
        (EXPOSED_FIGURE, figures.exposed_communication_s, "s",
         "step time minus the same step's under no_sync(): what communication costs"),
        ("GPU busy, rank 0", figures.rank0_busy(), "%", "NVML"),
        ("GPU busy, other ranks", figures.others_busy(), "%", "NVML: the article's \"others cool down waiting\""),
    ]


def _scaled(value: float | Unavailable, unit: float) -> float | Unavailable:
    return value if isinstance(value, Unavailable) else value * unit


FAMILY = Family(
    name="parallel",
    article="001",
    summary="multi-GPU step: DataParallel gathers every output on GPU 0; the loss inside the replicas, or DDP",
    variants=VARIANTS,
    params=(
        Param("world_size", 2, "ranks (ddp processes or data_parallel replicas) sharing the global batch"),
        Param("batch", 4, "images per rank; the global batch is world_size * batch"),
        Param("image_size", 64, "image height and width, in pixels", minimum=4),
        Param("model", SEGNET, "the net: segnet (the article's, 41 KB of gradients: one DDP bucket) or wide "
              "(segnet and a 25 MiB head: several buckets, the all-reduce can overlap backward)", choices=MODELS),
    ),
    builder=build,
    estimate=estimate,
    comparer=compare,
    smoke={"world_size": 2, "batch": 2, "image_size": 16},
    grids={
        # `model` is not swept: an axis added to the asv classes would leave every committed parallel result
        # unnamed by benchmarks.json (its parameters are the axes'); `wide` is for the probe, the gate and torchrun.
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
    calibrations=CHECKS,
    benchmark_figures={"track_step_time": STEP_TIME_FIGURE, "track_samples_per_second": SAMPLES_PER_SECOND_FIGURE,
                       "track_exposed_communication": EXPOSED_FIGURE, "track_communication": IN_FLIGHT_FIGURE,
                       "track_peak_memory_rank0": RANK0_MEMORY_FIGURE, "track_peak_memory_others": OTHERS_MEMORY_FIGURE,
                       "track_memory_imbalance": IMBALANCE_FIGURE, "track_scaling_efficiency": SCALING_FIGURE},
)


def case_figures(variant: str, device: str, *, nvml_seconds: float = 2.0, **sizes: Any) -> ParallelFigures:
    """One case's `measure_figures`: built, measured and closed, so that cases measured one after the other in one
    process are never live together.

    Raises:
        SkipCase: the case cannot run here, or its ranks failed to start (the other cases are still measured).
    """
    try:
        with FAMILY.build(variant, device=device, **sizes) as case:
            return measure_figures(case, nvml_seconds=nvml_seconds)
    except RankFailed as error:
        raise SkipCase(f"the ranks failed to start: {str(error).splitlines()[0]}") from error

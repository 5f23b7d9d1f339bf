"""One process's part of the parallel family's training step, the benchmark process's and each DDP rank's alike:
the seeded global batch and each rank's share of it, the net's seeded initial weights, and a `Trainer` that runs
one step and measures its time, peak memory and communication.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.profiler import ProfilerActivity, profile

from pitfalls.devices import device_threads
from pitfalls.distributed.steps import step_seconds, time_steps
from pitfalls.families.loss import IGNORE, SegNet, make_loss
from pitfalls.probes.nvml import NvmlSummary
from pitfalls.result import Unavailable

SINGLE = "single"
DATA_PARALLEL = "data_parallel"
DATA_PARALLEL_LOSS_INSIDE = "data_parallel_loss_inside"
DDP = "ddp"
VARIANTS = (SINGLE, DATA_PARALLEL, DATA_PARALLEL_LOSS_INSIDE, DDP)
NEEDS_GPUS = "needs 2 or more CUDA devices"
NUM_CLASSES = 10
DTYPES = {"float32": torch.float32, "float64": torch.float64}
# The nets a step can train: the article's toy SegNet (about 10,300 parameters, 41 KB of gradients: all of them in
# DDP's first 1 MiB bucket, so there is nothing to overlap), and `WideSegNet` (25.1 MiB of parameters: its
# gradients fill several of DDP's 25 MiB buckets, so the all-reduce can run while backward goes on).
SEGNET = "segnet"
WIDE = "wide"
MODELS = (SEGNET, WIDE)
WIDE_WIDTH = 1280
WIDE_LAYERS = 4

# What the profiler calls communication. gloo's collectives are recorded from enqueue to completion on the CPU;
# on a GPU the work is the nccl kernels (DDP's all-reduce, DataParallel's broadcast and reduce) and the
# device-to-device copies of DataParallel's scatter and gather.
_CPU_COMMUNICATION = ("gloo:",)
_GPU_COMMUNICATION = ("nccl", "Memcpy PtoP")
# What a rank's memory is on the CPU (`allocated_peak`).
STEP_PEAK = "torch CPU allocations at the step's peak"


@dataclass(frozen=True)
class StepConfig:
    """One training step of the family: how many ranks, images per rank, image size, seed and optimizer.

    Attributes:
        world_size: processes (ddp) or replicas (data_parallel) sharing the global batch.
        batch: images per rank; the global batch is ``world_size * batch``.
        image_size: image height and width, in pixels.
        num_classes: C, including the background class C-1.
        seed: seeds the net's initial weights and every image.
        lr: SGD learning rate.
        momentum: SGD momentum.
        dtype: "float32" (the benchmark) or "float64" (the equivalence gate).
        model: the net, one of `MODELS`.
    """

    world_size: int
    batch: int
    image_size: int
    num_classes: int = NUM_CLASSES
    seed: int = 0
    lr: float = 1e-3
    momentum: float = 0.9
    dtype: str = "float32"
    model: str = SEGNET

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype={self.dtype!r} is not allowed; allowed: {', '.join(DTYPES)}")
        if self.model not in MODELS:
            raise ValueError(f"model={self.model!r} is not allowed; allowed: {', '.join(MODELS)}")

    @property
    def global_batch(self) -> int:
        return self.world_size * self.batch

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]


def seeded_images(first: int, count: int, image_size: int, num_classes: int, seed: int) -> tuple[Tensor, Tensor]:
    """Images ``first .. first+count-1`` of the family's global batch, on the host.

    Each image is drawn from its own seed, so a rank builds only its own share and gets exactly the images
    ``single`` holds at the same positions. Labels: valid classes in [0, C-1), then ``pixels // (C + 1)`` pixels
    set to -1 and as many to the background class C-1, at seeded positions: every image has the same number of
    valid pixels (docs/families/parallel.md: "The same step, not a similar one").

    Returns:
        images ``[count, 3, H, W]`` float32 and labels ``[count, H, W]`` int64.
    """
    pixels = image_size * image_size
    ignored = pixels // (num_classes + 1)
    images, labels = [], []
    for index in range(first, first + count):
        # torch's CPU generator keeps 32 bits of a seed: SeedSequence mixes (seed, index) into 32 well-spread bits.
        generator = torch.Generator().manual_seed(int(np.random.SeedSequence([seed, index]).generate_state(1)[0]))
        images.append(torch.randn(3, image_size, image_size, generator=generator))
        label = torch.randint(0, num_classes - 1, (pixels,), generator=generator)
        where = torch.randperm(pixels, generator=generator)
        label[where[:ignored]] = IGNORE
        label[where[ignored : 2 * ignored]] = num_classes - 1
        labels.append(label.view(image_size, image_size))
    return torch.stack(images), torch.stack(labels)


class WideSegNet(nn.Module):
    """`SegNet` plus a wide head: ``WIDE_LAYERS`` Linear(``WIDE_WIDTH``, ``WIDE_WIDTH``) layers on each image's mean
    colour, whose output shifts that image's class logits.

    25.1 MiB of parameters at little compute (the head sees one vector per image), so that DDP has gradients
    enough to fill several buckets; the segmentation step and its loss are SegNet's.
    """

    def __init__(self, num_classes: int = NUM_CLASSES) -> None:
        super().__init__()
        self.segnet = SegNet(num_classes)
        layers: list[nn.Module] = [nn.Linear(3, WIDE_WIDTH), nn.ReLU()]
        for _ in range(WIDE_LAYERS):
            layers += [nn.Linear(WIDE_WIDTH, WIDE_WIDTH), nn.ReLU()]
        self.head = nn.Sequential(*layers, nn.Linear(WIDE_WIDTH, num_classes))

    def forward(self, x: Tensor) -> Tensor:
        return self.segnet(x) + self.head(x.mean(dim=(2, 3)))[:, :, None, None]


def _net(model: str, num_classes: int) -> nn.Module:
    return SegNet(num_classes) if model == SEGNET else WideSegNet(num_classes)


def parameter_count(model: str, num_classes: int = NUM_CLASSES) -> int:
    """Parameters of a net of `MODELS`, counted on the meta device (nothing is allocated)."""
    with torch.device("meta"):
        return sum(p.numel() for p in _net(model, num_classes).parameters())


def initial_net(config: StepConfig) -> nn.Module:
    """The net every variant and rank starts from: the same seeded weights everywhere."""
    torch.manual_seed(config.seed)
    return _net(config.model, config.num_classes).to(config.torch_dtype)


@dataclass(frozen=True)
class Shard:
    """Which samples of the global batch a process trained on: an index range and a checksum of the images.

    Attributes:
        first: index of the first image in the global batch.
        count: images.
        checksum: the sum of the images it trained on, in float64 (the gate recomputes it from the global batch).
    """

    first: int
    count: int
    checksum: float

    @classmethod
    def of(cls, first: int, images: Tensor) -> Shard:
        """The shard of ``images``, which claim to start at ``first``."""
        return cls(first, int(images.shape[0]), float(images.detach().to("cpu", torch.float64).sum()))


@dataclass(frozen=True)
class RankFigures:
    """What one rank (a DDP process, or one device of a DataParallel step) measured over one step.

    Attributes:
        rank: the global rank, or the device index of a DataParallel replica.
        host: the host name (ranks may live on several nodes).
        pid: the process that ran it.
        device: the device, e.g. "cuda:1" or "cpu".
        seconds: the step's wall time in that process, synchronized.
        peak_bytes: CUDA max allocated on a GPU; on the CPU torch's allocations at the step's high point,
            above its start (`allocated_peak`).
        memory: which of the two ``peak_bytes`` is.
    """

    rank: int
    host: str
    pid: int
    device: str
    seconds: float
    peak_bytes: int
    memory: str


@dataclass(frozen=True)
class ParallelFigures:
    """The family's own figures of one case (besides asv's time per step and the speedup over ``single``).

    Attributes:
        step_s: seconds per step: each process times `parallel.FIGURE_STEPS` steps after a barrier, and this is the
            slowest process's median (`pitfalls.distributed.step_seconds`), for every variant.
        samples_per_s: the global batch over ``step_s``.
        ranks: each rank's (device's) time and peak memory over one step, rank 0 first.
        communication_s: seconds of one profiled step in which communication was in flight, averaged over the
            processes (including waiting for a slower peer and what overlaps the backward).
        exposed_communication_s: seconds communication adds to a step: the step time minus the same step's
            under DDP's ``no_sync()`` (ddp only).
        busy_pct: NVML's GPU utilization per device, rank 0 first, while the case loops; GPUs only.
    """

    step_s: float | Unavailable
    samples_per_s: float | Unavailable
    ranks: tuple[RankFigures, ...] | Unavailable
    communication_s: float | Unavailable
    busy_pct: tuple[float, ...] | Unavailable
    exposed_communication_s: float | Unavailable = Unavailable("not measured")

    def rank0_memory(self) -> int | Unavailable:
        return self.ranks if isinstance(self.ranks, Unavailable) else self.ranks[0].peak_bytes

    def others_memory(self) -> float | Unavailable:
        """Mean peak memory of the ranks other than rank 0."""
        if isinstance(self.ranks, Unavailable):
            return self.ranks
        others = [r.peak_bytes for r in self.ranks[1:]]
        return sum(others) / len(others) if others else Unavailable("one rank: no other rank to compare")

    def memory_imbalance(self) -> float | Unavailable:
        """Rank 0's peak memory over the others' mean (1 = balanced; DataParallel's GPU 0 holds more)."""
        others, rank0 = self.others_memory(), self.rank0_memory()
        if isinstance(others, Unavailable):
            return others
        if isinstance(rank0, Unavailable):
            return rank0
        return rank0 / others if others > 0 else Unavailable("the other ranks held nothing at their step's peak: "
                                                              "no ratio")

    def rank0_busy(self) -> float | Unavailable:
        return self.busy_pct if isinstance(self.busy_pct, Unavailable) else self.busy_pct[0]

    def others_busy(self) -> float | Unavailable:
        """Mean NVML busy % of the devices other than rank 0's."""
        if isinstance(self.busy_pct, Unavailable):
            return self.busy_pct
        others = self.busy_pct[1:]
        return sum(others) / len(others) if others else Unavailable("one rank: no other device to compare")


def per_second(step_s: float | Unavailable, samples: int) -> float | Unavailable:
    """Samples per second of a step of ``samples`` (the global batch) that takes ``step_s``, or why there is none."""
    return step_s if isinstance(step_s, Unavailable) else samples / step_s


def scaling_efficiency(variant: str, world_size: int, figures: ParallelFigures,
                       one_rank: ParallelFigures | str | None) -> float | Unavailable:
    """Weak-scaling efficiency of ddp: samples/s of W ranks over W times the samples/s of one rank.

    The batch per rank is fixed, so W ranks do W times one rank's work: 1.0 is perfect scaling, and what is
    missing is the all-reduce, the waits for the slowest rank and whatever the ranks share (cores, memory
    bandwidth, PCIe or NVLink).

    Args:
        variant: the case's variant (ddp only).
        world_size: its ranks.
        figures: its own figures.
        one_rank: the figures of the same case at one rank, or the reason that case has none (None: not in the
            grid).

    Returns:
        The efficiency, or n/a with the reason.
    """
    if variant != DDP:
        return Unavailable("weak scaling is ddp's figure: ranks with a fixed batch each")
    if world_size == 1:
        return Unavailable("one rank: the reference of the efficiency")
    if one_rank is None:
        return Unavailable("the grid has no 1-rank ddp case to compare with")
    if isinstance(one_rank, str):
        return Unavailable(f"the 1-rank ddp case did not run: {one_rank}")
    for rate in (figures.samples_per_s, one_rank.samples_per_s):
        if isinstance(rate, Unavailable):
            return rate
    assert not isinstance(figures.samples_per_s, Unavailable) and not isinstance(one_rank.samples_per_s, Unavailable)
    return figures.samples_per_s / (world_size * one_rank.samples_per_s)


def allocated_peak(events: Sequence[Any]) -> int:
    """Bytes torch's CPU allocator held at the high point of a profiled window, above what it held at its start.

    Args:
        events: ``torch.profiler.profile(profile_memory=True).events()``: each op's own allocations net of its own
            frees (``self_cpu_memory_usage``), and the frees outside any op (``[memory]`` events).

    Returns:
        The largest running sum of those, in time order; 0 when nothing was held beyond the start.
    """
    ordered = sorted((e for e in events if e.self_cpu_memory_usage), key=lambda e: e.time_range.start)
    return max(itertools.accumulate((e.self_cpu_memory_usage for e in ordered), initial=0))


def communication_seconds(events: Sequence[Any], on_gpu: bool) -> float:
    """Time in which some communication was in flight, from a profiler's events (overlaps counted once).

    Args:
        events: ``torch.profiler.profile(...).events()``.
        on_gpu: read the device's nccl kernels and peer copies; else gloo's collectives on the CPU.

    Returns:
        Seconds: the length of the union of the events' [start, end) intervals.
    """
    prefixes = _GPU_COMMUNICATION if on_gpu else _CPU_COMMUNICATION
    wanted = torch.autograd.DeviceType.CUDA if on_gpu else torch.autograd.DeviceType.CPU
    total, reach = 0.0, float("-inf")
    for start, end in sorted((e.time_range.start, e.time_range.end) for e in events
                             if e.device_type == wanted and e.name.startswith(prefixes)):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total / 1e6  # the profiler's times are microseconds


class Trainer:
    """One process's part of the step: forward with the loss, backward, optimizer step, on inputs built once.

    Args:
        net: the `SegNet` whose weights the optimizer updates (unwrapped).
        forward: ``forward(images, labels) -> loss``: the net, wrapped or not, and the loss.
        images: this process's images, on its first device.
        labels: their labels.
        devices: every device the step runs on in this process (DataParallel: all of them).
        config: the step's configuration.
        rank: the global rank of the first device (DDP); 0 otherwise.
        first: the index in the global batch of the first image it was given (its `Shard`).
        communicates: whether the step exchanges anything between devices (False for ``single``).
        no_sync: DDP's ``no_sync``: the same step without the gradient all-reduce (exposed communication).
    """

    def __init__(self, net: nn.Module, forward: Callable[[Tensor, Tensor], Tensor], images: Tensor, labels: Tensor,
                 devices: Sequence[torch.device], config: StepConfig, *, rank: int = 0, first: int = 0,
                 communicates: bool = True,
                 no_sync: Callable[[], contextlib.AbstractContextManager[Any]] | None = None) -> None:
        self.net = net
        self.forward = forward
        self.images, self.labels = images, labels
        self.devices = tuple(devices)
        self.config = config
        self.rank = rank
        self.communicates = communicates
        self.no_sync = no_sync
        self.optimizer = torch.optim.SGD(net.parameters(), lr=config.lr, momentum=config.momentum)
        self.shard = Shard.of(first, images)

    def step(self) -> Tensor:
        """Run one step, queued on the device(s), not synchronized; return the loss. On the CPU the step runs on
        one core's threads (`pitfalls.devices.device_threads`), in this process as in each gloo rank: one core is
        one device, so ``single`` is one device's step and ddp's speedup over it is its scaling."""
        with device_threads(self.devices[0]):
            self.optimizer.zero_grad(set_to_none=True)
            loss = self.forward(self.images, self.labels)
            loss.backward()
            self.optimizer.step()
        return loss.detach()

    def __call__(self) -> Tensor:
        return self.step()

    def synchronize(self) -> None:
        """Wait for the queued work of every CUDA device the step runs on; nothing to wait for on the CPU."""
        for device in self.devices:
            if device.type == "cuda":
                torch.cuda.synchronize(device)

    def block(self, calls: int) -> float:
        """Seconds per step of ``calls`` steps: the suite's one step routine (`pitfalls.distributed.time_steps`),
        a world of one process."""
        return step_seconds([time_steps(self.step, self.synchronize, calls)])

    def measure(self) -> list[RankFigures]:
        """Run a step and return its time and peak memory, one entry per device this process drives (on the CPU,
        the memory of a second step, profiled)."""
        host, pid = socket.gethostname(), os.getpid()
        self.synchronize()
        if self.devices[0].type == "cuda":
            for device in self.devices:
                torch.cuda.reset_peak_memory_stats(device)
            start = time.perf_counter()
            self.step()
            self.synchronize()
            seconds = time.perf_counter() - start
            return [RankFigures(self.rank + i, host, pid, str(device), seconds,
                                int(torch.cuda.max_memory_allocated(device)), "CUDA max allocated")
                    for i, device in enumerate(self.devices)]
        start = time.perf_counter()
        self.step()
        seconds = time.perf_counter() - start
        # torch's own allocations, as CUDA's max allocated counts them on a GPU: not the process's USS, in which
        # libtorch weighs the same in every rank (the ratio of two such totals reads about 1 whatever the step
        # holds), and whose growth over a step is whatever malloc did not find free in its heap (3.8-7.1 MiB for
        # one rank's step read in turn). A second step, profiled, so that the time above is not the profiler's.
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
            self.step()
        return [RankFigures(self.rank, host, pid, "cpu", seconds, allocated_peak(profiler.events()), STEP_PEAK)]

    def communication(self) -> float | Unavailable:
        """Seconds of one step in which communication was in flight, from torch.profiler."""
        if not self.communicates:
            return Unavailable("one device: nothing is communicated")
        on_gpu = self.devices[0].type == "cuda"
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
        self.synchronize()
        with profile(activities=activities) as profiler:
            self.step()
            self.synchronize()
        return communication_seconds(profiler.events(), on_gpu)

    def step_without_communication(self) -> None:
        """One step under DDP's ``no_sync()``: the same work without the gradient all-reduce (the weights drift
        apart across ranks meanwhile; only its time is wanted)."""
        if self.no_sync is None:
            raise ValueError("only a DDP rank has a step without its communication (no_sync)")
        with self.no_sync():
            self.step()

    def full_state(self) -> dict[str, Tensor]:
        """The weights and the optimizer's momentum buffers (``momentum.<name>``), copied to the host."""
        state = {f"net.{name}": value.detach().cpu().clone() for name, value in self.net.state_dict().items()}
        for name, parameter in self.net.named_parameters():
            buffer = self.optimizer.state.get(parameter, {}).get("momentum_buffer")
            if buffer is not None:
                state[f"momentum.{name}"] = buffer.detach().cpu().clone()
        return state

    def close(self) -> None:
        """Nothing to release: the step runs in this process and its memory goes with the trainer."""


class _LossInside(nn.Module):
    """The net and the loss as one module, so DataParallel's replicas each return a scalar, not their logits."""

    def __init__(self, net: nn.Module, loss: nn.Module) -> None:
        super().__init__()
        self.net, self.loss = net, loss

    def forward(self, images: Tensor, labels: Tensor) -> Tensor:
        # One element rather than a 0-d tensor: DataParallel gathers 0-d outputs with a warning.
        return self.loss(self.net(images), labels).reshape(1)


def delayed_allreduce(seconds: float) -> Callable[[Any, Any], torch.futures.Future[Tensor]]:
    """A DDP communication hook that waits ``seconds`` before each bucket's all-reduce (DDP's own average).

    A known answer for exposed communication: the wait blocks the backward that reached the bucket, so with one
    bucket (segnet) each step grows by ``seconds``, and the same step under ``no_sync()`` calls no hook.
    """
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    def hook(state: Any, bucket: Any) -> torch.futures.Future[Tensor]:
        time.sleep(seconds)
        return allreduce_hook(state, bucket)

    # DDP checks the annotations against the objects themselves; this module's are strings (postponed).
    hook.__annotations__ = {"state": Any, "bucket": torch.distributed.GradBucket,
                            "return": torch.futures.Future[Tensor]}
    return hook


class HeldInForward:
    """Calibration: a forward that also allocates and touches ``nbytes``, held until the backward starts (as the
    activations a forward keeps are), so a step's memory grows by a known amount at its high point.

    Args:
        forward: the step's ``forward(images, labels) -> loss``.
        nbytes: bytes held from the forward to the start of the backward.
    """

    def __init__(self, forward: Callable[[Tensor, Tensor], Tensor], nbytes: int) -> None:
        self.forward = forward
        self.nbytes = nbytes

    def __call__(self, images: Tensor, labels: Tensor) -> Tensor:
        held = [torch.ones(self.nbytes, dtype=torch.uint8, device=images.device)]  # ones: every page written
        loss = self.forward(images, labels)
        # The loss's gradient is the backward's first: from there the planted bytes are free, as activations are.
        loss.register_hook(lambda _grad: held.clear())
        return loss


def make_trainer(variant: str, device: torch.device, config: StepConfig, *, rank: int = 0,
                 comm_delay_s: float | None = None, held_mib: float | None = None) -> Trainer:
    """Build one process's part of a variant's step.

    Args:
        variant: ``single``, ``data_parallel``, ``data_parallel_loss_inside``, or ``ddp`` (then the default
            process group must be initialized: this is what each rank runs).
        device: the process's device (``single``, ``ddp``); DataParallel always runs on cuda:0 .. cuda:W-1 (pick
            the GPUs with CUDA_VISIBLE_DEVICES), as each DDP rank r runs on its node's cuda:r.
        config: the step.
        rank: the DDP rank, which picks this rank's share of the global batch.
        comm_delay_s: calibration (ddp): each bucket's all-reduce waits this long first (`delayed_allreduce`);
            None: DDP's own all-reduce, no hook.
        held_mib: calibration (ddp): each forward also holds this many MiB until the backward (`HeldInForward`).

    Returns:
        The `Trainer`.
    """
    if variant in (DATA_PARALLEL, DATA_PARALLEL_LOSS_INSIDE):
        # DataParallel keeps the net on its first device and replicates it to the others each step.
        devices = [torch.device("cuda", i) for i in range(config.world_size)]
        device = devices[0]
    net = initial_net(config).to(device)
    loss = make_loss("ignore_index", config.num_classes).to(device)
    share = config.batch if variant == DDP else config.global_batch
    first = rank * share if variant == DDP else 0
    images, labels = seeded_images(first, share, config.image_size, config.num_classes, config.seed)
    images, labels = images.to(device, config.torch_dtype), labels.to(device)
    if variant == SINGLE:
        return Trainer(net, lambda x, y: loss(net(x), y), images, labels, (device,), config, communicates=False)
    if variant == DDP:
        wrapped = nn.parallel.DistributedDataParallel(net, device_ids=[device.index] if device.type == "cuda" else None)
        if comm_delay_s is not None:
            wrapped.register_comm_hook(None, delayed_allreduce(comm_delay_s))
        forward: Callable[[Tensor, Tensor], Tensor] = lambda x, y: loss(wrapped(x), y)  # noqa: E731
        if held_mib is not None:
            forward = HeldInForward(forward, round(held_mib * 2**20))
        return Trainer(net, forward, images, labels, (device,), config, rank=rank, first=first,
                       no_sync=wrapped.no_sync)
    ids = [d.index for d in devices]
    if variant == DATA_PARALLEL:
        replicated = nn.DataParallel(net, device_ids=ids)
        return Trainer(net, lambda x, y: loss(replicated(x), y), images, labels, devices, config)
    inside = nn.DataParallel(_LossInside(net, loss), device_ids=ids)
    # Every replica holds as many valid pixels, so the mean of their means is the global batch's mean.
    return Trainer(net, lambda x, y: inside(x, y).mean(), images, labels, devices, config)


def utilization(summary: NvmlSummary | Unavailable) -> float | Unavailable:
    """The mean GPU utilization % an NVML window saw, or why there is none."""
    if isinstance(summary, Unavailable):
        return summary
    if isinstance(summary.utilization_pct, Unavailable):
        return summary.utilization_pct
    return summary.utilization_pct.mean

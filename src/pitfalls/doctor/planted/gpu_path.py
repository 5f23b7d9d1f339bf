"""A training script written for one CUDA GPU with each rule of the GPU path planted once, and beside each its
right-thing twin (``python gpu_path.py`` on a GPU; ``pitfalls doctor --cuda-on-cpu gpu_path.py`` on a CPU, where
its rows run it; it imports nothing of pitfalls and trains until it is stopped).

A line that plants a rule says ``# planted: ...``; its twin, which must read no finding of that rule, says
``# right: ...``. Planted: GradScaler with an optimizer that is not fused and its scale read every step; a
GradScaler with bfloat16 autocast; DDP, one process of one rank, with gradient accumulation over ``MICRO``
micro-batches without ``no_sync``, with ``no_sync`` around the backward alone, and with ``find_unused_parameters``
where every parameter is used; ``nn.DataParallel``; and settings left on from debugging: anomaly detection, a
profiler, deterministic algorithms, ``CUDA_LAUNCH_BLOCKING=1`` and a convolution of one shape with
``cudnn.benchmark`` off. Every setting it changes is put back when it ends.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

BATCH, WIDTH, MICRO = 8, 16, 4


class Branchy(nn.Module):
    """Two branches, the second never used: DDP must look for unused parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.used = nn.Linear(WIDTH, WIDTH)
        self.unused = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(x)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def debugged(device: torch.device) -> None:
    """One backward while debugging, before training."""
    torch.ones(2, device=device, requires_grad=True).square().sum().backward()


def train(device: torch.device) -> None:
    ids = [0] if device.type == "cuda" else None

    def layer() -> nn.Module:
        return nn.Linear(WIDTH, WIDTH).to(device)

    half, brain = nn.Sequential(layer(), layer()), layer()
    slow = torch.optim.AdamW(half[0].parameters(), lr=1e-3)
    fused = torch.optim.AdamW(half[1].parameters(), lr=1e-3, fused=True)
    brain_fused = torch.optim.AdamW(brain.parameters(), lr=1e-3, fused=True)
    scaler, brain_scaler = torch.amp.GradScaler(device.type), torch.amp.GradScaler(device.type)
    accumulated = DistributedDataParallel(layer(), ids, find_unused_parameters=True)  # planted: none is unused
    synced = DistributedDataParallel(layer(), ids)  # right: one process a GPU
    misplaced = DistributedDataParallel(layer(), ids)
    branchy = DistributedDataParallel(Branchy().to(device), ids, find_unused_parameters=True)  # right: one unused
    parallel = nn.DataParallel(layer(), ids)  # planted: DataParallel
    tuned_conv, plain_conv = nn.Conv2d(3, 8, 3).to(device), nn.Conv2d(3, 8, 3).to(device)
    models = (accumulated, synced, misplaced, branchy, parallel, tuned_conv, plain_conv)
    sgd = torch.optim.SGD([p for model in models for p in model.parameters()], lr=1e-3)
    step = 0
    while True:
        step += 1
        x = torch.randn(MICRO, BATCH, WIDTH, device=device)
        for optimizer in (slow, fused, brain_fused, sgd):
            optimizer.zero_grad()
        with torch.autocast(device.type, dtype=torch.float16):
            half_loss = half(x[0]).float().square().mean()
        scaler.scale(half_loss).backward()  # right: float16 autocast needs the scaler
        with torch.autocast(device.type, dtype=torch.bfloat16):
            brain_loss = brain(x[0]).float().square().mean()
        brain_scaler.scale(brain_loss).backward()  # planted: a GradScaler with bfloat16 autocast
        for micro in range(MICRO):
            accumulated_loss = accumulated(x[micro]).square().mean()  # planted: an all-reduce every micro-batch
            accumulated_loss.backward()
        for micro in range(MICRO):
            with synced.no_sync() if micro < MICRO - 1 else contextlib.nullcontext():
                synced_loss = synced(x[micro]).square().mean()  # right: forward and backward inside no_sync
                synced_loss.backward()
        for micro in range(MICRO):
            outside = misplaced(x[micro]).square().mean()  # planted: the forward outside no_sync
            with misplaced.no_sync() if micro < MICRO - 1 else contextlib.nullcontext():
                outside.backward()
        (branchy(x[0]).square().mean() + parallel(x[0]).square().mean()).backward()
        with torch.no_grad():
            images = torch.randn(BATCH, 3, 8, 8, device=device)
            torch.backends.cudnn.benchmark = True
            tuned = tuned_conv(images)  # right: cudnn.benchmark on for a shape that never changes
            torch.backends.cudnn.benchmark = False
            plain = plain_conv(images)  # planted: cudnn.benchmark off, the same shape every step
        scaler.step(slow)  # planted: GradScaler reads found_inf with .item()
        scaler.step(fused)  # right: a fused optimizer takes found_inf on the device
        brain_scaler.step(brain_fused)
        scaler.update()
        brain_scaler.update()
        sgd.step()
        current = scaler.get_scale()  # planted: the scale read every step
        if step == 1:
            initial = scaler.get_scale()  # right: read once, on a step that logs it
            del initial
        del tuned, plain, current


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    device = torch.device(parser.parse_args().device)
    saved = (os.environ.get("CUDA_LAUNCH_BLOCKING"), torch.is_anomaly_enabled(), torch.get_float32_matmul_precision(),
             torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.benchmark)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # what deterministic cuBLAS asks for
    torch.set_float32_matmul_precision("high")
    os.environ["CUDA_LAUNCH_BLOCKING"] = "0"  # right: kernel launches stay asynchronous
    os.environ["CUDA_LAUNCH_BLOCKING"] = "1"  # planted: left on from debugging
    torch.use_deterministic_algorithms(False)  # right: the fastest kernels
    torch.use_deterministic_algorithms(True)  # planted: deterministic kernels
    with torch.autograd.detect_anomaly(check_nan=False):  # right: anomaly detection for one debugging pass
        debugged(device)
    torch.autograd.set_detect_anomaly(True)  # planted: anomaly detection left on
    with torch.profiler.profile():  # right: a profile of one debugging pass, done before training
        debugged(device)
    profiler = torch.profiler.profile()
    profiler.start()  # planted: a profiler left running
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                            init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        train(device)
    finally:
        profiler.stop()
        dist.destroy_process_group()
        blocking, anomaly, precision, deterministic, benchmark = saved
        os.environ.pop("CUDA_LAUNCH_BLOCKING")
        if blocking is not None:
            os.environ["CUDA_LAUNCH_BLOCKING"] = blocking
        torch.autograd.set_detect_anomaly(anomaly)
        torch.set_float32_matmul_precision(precision)
        torch.use_deterministic_algorithms(deterministic)
        torch.backends.cudnn.benchmark = benchmark


if __name__ == "__main__":
    main()

"""One rank of the parallel family's DDP step: what ``torchrun`` starts, once per device.

Two ways to run it:

- **Driven** (``--control HOST:PORT``): started by `parallel_launch.RankGroup` on one machine; the rank builds its
  share of the step, reports ready, then runs each command the group sets in its control store ("step",
  "measure", "communication", "state", "stop") until told to stop. The benchmark process times the steps.
- **Standalone** (``--steps N --out DIR``): the rank warms up, times N steps itself, measures its memory,
  communication and (on a GPU) NVML busy %, and writes ``DIR/rank<r>-<host>.json``; rank 0 also writes
  ``DIR/summary.json`` with every rank's figures. This is the multi-node form: one
  ``torchrun --nnodes=N ... -m pitfalls.families.parallel_rank ...`` command per node (see the README).

torchrun supplies RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT; the process group is gloo on the CPU
and nccl on GPUs (rank r on its node's cuda:LOCAL_RANK).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import os
import socket
import statistics
import sys
import time
import traceback
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import psutil
import torch
import torch.distributed as dist
from torch.distributed import DistError, DistStoreError, TCPStore

from pitfalls.families.parallel_step import DDP, StepConfig, Trainer, make_trainer, utilization
from pitfalls.probes.nvml import NvmlSampler
from pitfalls.probes.result import Unavailable

WARMUP_STEPS = 2
# Seconds between checks, while idle, that the process driving the ranks still exists.
IDLE_CHECK_S = 60.0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m pitfalls.families.parallel_rank", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu",
                        help="cpu (gloo) or cuda (nccl); default cuda when present")
    parser.add_argument("--batch", type=int, default=4, help="images per rank (default 4)")
    parser.add_argument("--image-size", type=int, default=64, help="image height and width (default 64)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the weights and the images (default 0)")
    parser.add_argument("--lr", type=float, default=1e-3, help="SGD learning rate (default 1e-3)")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32",
                        help="the net's and the images' dtype (default float32)")
    parser.add_argument("--world-size", type=int, help="expected world size (default: torchrun's WORLD_SIZE)")
    parser.add_argument("--threads", type=int, help="intra-op threads (default: torch's, from OMP_NUM_THREADS)")
    driven = parser.add_argument_group("driven by a RankGroup")
    driven.add_argument("--control", metavar="HOST:PORT", help="the group's control store")
    driven.add_argument("--prefix", default="", help="the group's key prefix")
    driven.add_argument("--launcher-pid", type=int, help="the group's process; the rank exits when it is gone")
    alone = parser.add_argument_group("standalone (one torchrun per node)")
    alone.add_argument("--steps", type=int, default=20, help="timed steps (default 20)")
    alone.add_argument("--out", type=Path, help="folder for this node's rank files (and rank 0's summary.json)")
    args = parser.parse_args(argv)
    if (args.control is None) == (args.out is None):
        parser.error("give exactly one of --control (driven) and --out (standalone)")
    for name in ("batch", "image_size", "steps", "threads", "world_size"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')}={value} is not allowed; it must be an int >= 1")
    return args


def init_rank(args: argparse.Namespace) -> tuple[Trainer, int, int]:
    """Join torchrun's process group and build this rank's share of the step; returns (trainer, rank, world)."""
    rank, world_size, local_rank = (int(os.environ[k]) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    if args.world_size is not None and args.world_size != world_size:
        raise ValueError(f"--world-size={args.world_size} but torchrun started WORLD_SIZE={world_size} ranks")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.device == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                            timeout=datetime.timedelta(seconds=600),
                            device_id=device if device.type == "cuda" else None)
    config = StepConfig(world_size=world_size, batch=args.batch, image_size=args.image_size, seed=args.seed,
                        lr=args.lr, dtype=args.dtype)
    return make_trainer(DDP, device, config, rank=rank), rank, world_size


def execute(trainer: Trainer, command: str, rank: int) -> bytes:
    """Run one command of the group and return this rank's reply."""
    if command == "step":
        loss = trainer.step()
        trainer.synchronize()
        return json.dumps({"loss": float(loss)}).encode()
    if command == "measure":
        [mine] = trainer.measure()
        return json.dumps(asdict(mine)).encode()
    if command == "communication":
        seconds = trainer.communication()
        assert not isinstance(seconds, Unavailable)  # a DDP rank always communicates
        return json.dumps({"seconds": seconds}).encode()
    if command == "state":
        if rank != 0:
            return b"{}"
        buffer = io.BytesIO()
        torch.save(trainer.state(), buffer)
        return buffer.getvalue()
    raise ValueError(f"command {command!r} is not a command; allowed: step, measure, communication, state, stop")


class Server:
    """The driven rank's loop: wait for command n, run it, reply, count; report any error before dying."""

    def __init__(self, args: argparse.Namespace) -> None:
        host, _, port = args.control.rpartition(":")
        self.store = TCPStore(host, int(port), is_master=False, timeout=datetime.timedelta(seconds=IDLE_CHECK_S))
        self.prefix = args.prefix
        self.launcher_pid = args.launcher_pid
        self.rank = int(os.environ["RANK"])
        self.n = 0

    def reply(self, value: bytes, world_size: int) -> None:
        # The store takes bytes as well as text (the "state" reply is torch.save's bytes); its stub says str only.
        self.store.set(f"{self.prefix}result/{self.n}/{self.rank}", value)  # type: ignore[arg-type]
        if self.store.add(f"{self.prefix}count/{self.n}", 1) == world_size:
            self.store.set(f"{self.prefix}done/{self.n}", "ok")

    def command(self) -> str:
        key = f"{self.prefix}cmd/{self.n}"
        while True:
            try:
                self.store.wait([key], datetime.timedelta(seconds=IDLE_CHECK_S))
                return self.store.get(key).decode()
            except DistStoreError:
                # Idle for a while: carry on only if the process driving the ranks is still there.
                if self.launcher_pid is not None and not psutil.pid_exists(self.launcher_pid):
                    raise SystemExit(f"rank {self.rank}: the launching process {self.launcher_pid} is gone") from None

    def report_error(self) -> None:
        message = f"rank {self.rank} ({socket.gethostname()}, pid {os.getpid()}) failed:\n{traceback.format_exc()}"
        # The store may be what failed; the error is raised again either way.
        with contextlib.suppress(DistError):
            self.store.compare_set(f"{self.prefix}error", "", message)
            self.store.set(f"{self.prefix}done/{self.n}", "error")

    def run(self, args: argparse.Namespace) -> None:
        try:
            trainer, rank, world_size = init_rank(args)
            self.reply(json.dumps({"pid": os.getpid(), "host": socket.gethostname()}).encode(), world_size)
            while True:
                self.n += 1
                command = self.command()
                if command == "stop":
                    break
                self.reply(execute(trainer, command, rank), world_size)
        except BaseException:
            # No destroy_process_group here: with a peer gone it can block (nccl), and exiting releases it all.
            self.report_error()
            raise
        dist.destroy_process_group()


def standalone(args: argparse.Namespace) -> dict[str, Any]:
    """Warm up, time ``--steps`` steps, measure, and write this rank's file (rank 0: and the summary)."""
    trainer, rank, world_size = init_rank(args)
    for _ in range(WARMUP_STEPS):
        trainer.step()
    trainer.synchronize()
    device = trainer.devices[0]
    sampler = NvmlSampler(device) if device.type == "cuda" else None
    times = []
    with sampler if sampler is not None else contextlib.nullcontext():
        for _ in range(args.steps):
            start = time.perf_counter()
            trainer.step()
            trainer.synchronize()
            times.append(time.perf_counter() - start)
    [mine] = trainer.measure()
    busy = utilization(sampler.summary) if sampler is not None else Unavailable("no CUDA device")
    record = {
        **asdict(mine),
        "node_rank": int(os.environ.get("GROUP_RANK", "0")),
        "local_rank": int(os.environ["LOCAL_RANK"]),
        "step_s_median": statistics.median(times),
        "steps": args.steps,
        "communication_s": trainer.communication(),
        "gpu_busy_pct": busy.reason if isinstance(busy, Unavailable) else busy,
    }
    gathered: list[Any] = [None] * world_size
    dist.all_gather_object(gathered, record)
    dist.destroy_process_group()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"rank{rank:03d}-{mine.host}.json").write_text(json.dumps(record, indent=1) + "\n")
    if rank == 0:
        step_s = max(r["step_s_median"] for r in gathered)  # a step ends when the slowest rank's does
        summary = {
            "world_size": world_size,
            "nodes": sorted({r["host"] for r in gathered}),
            "batch_per_rank": args.batch,
            "global_batch": world_size * args.batch,
            "image_size": args.image_size,
            "device": args.device,
            "step_s": step_s,
            "samples_per_s": world_size * args.batch / step_s,
            "ranks": gathered,
        }
        (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return record


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.control is not None:
        Server(args).run(args)
    else:
        standalone(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

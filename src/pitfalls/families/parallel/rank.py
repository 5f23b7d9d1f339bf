"""One rank of the parallel family's DDP step: a small table of commands over `pitfalls.distributed`.

Two ways to run it:

- **Driven**: started by `pitfalls.distributed.RankGroup` (the family's `launch.DdpGroup`) on one
  machine; the rank builds its share of the step, then runs the group's commands (`COMMANDS`) until told to stop.
- **Standalone** (``--steps N --out DIR``, under ``torchrun``): the rank times N steps with the same routine
  (`pitfalls.distributed.time_steps`), measures its memory, communication and (on a GPU) NVML busy %, and writes
  ``DIR/rank<r>-<host>.json``; rank 0 also writes ``DIR/summary.json`` with every rank's figures and the step time
  (the slowest rank's median). This is the multi-node form: one ``torchrun --nnodes=N ...
  -m pitfalls.families.parallel.rank ...`` command per node (see the README).

RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT come from the launcher; the process group is gloo on the
CPU and nccl on GPUs (rank r on its node's cuda:LOCAL_RANK).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from pitfalls.argtypes import positive
from pitfalls.distributed import serve, step_seconds, time_steps
from pitfalls.distributed.control import CONTROL_ENV
from pitfalls.distributed.launch import PROCESS_GROUP_TIMEOUT_S
from pitfalls.families.parallel.step import DDP, MODELS, SEGNET, StepConfig, Trainer, make_trainer, utilization
from pitfalls.probes.nvml import NvmlSampler
from pitfalls.result import Unavailable


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m pitfalls.families.parallel.rank", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu",
                        help="cpu (gloo) or cuda (nccl); default cuda when present")
    parser.add_argument("--batch", type=positive(int), default=4, help="images per rank (default 4)")
    parser.add_argument("--image-size", type=positive(int), default=64, help="image height and width (default 64)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the weights and the images (default 0)")
    parser.add_argument("--lr", type=float, default=1e-3, help="SGD learning rate (default 1e-3)")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32",
                        help="the net's and the images' dtype (default float32)")
    parser.add_argument("--model", choices=MODELS, default=SEGNET,
                        help="the net: segnet (the article's, one DDP bucket) or wide (25 MiB: several buckets)")
    parser.add_argument("--world-size", type=positive(int),
                        help="expected world size (default: the launcher's WORLD_SIZE)")
    parser.add_argument("--threads", type=positive(int),
                        help="intra-op threads (default: torch's, from OMP_NUM_THREADS)")
    parser.add_argument("--pg-timeout", type=float, default=PROCESS_GROUP_TIMEOUT_S,
                        help=f"seconds a collective may wait for a peer (default {PROCESS_GROUP_TIMEOUT_S:g})")
    parser.add_argument("--plant-sleep-ms", type=float, nargs="+", metavar="MS",
                        help="calibration: each step of rank r sleeps the r-th value instead of training")
    parser.add_argument("--plant-comm-ms", type=float, nargs="+", metavar="MS",
                        help="calibration: rank r's gradient buckets' all-reduce, by a Python hook, waits the r-th "
                             "value first (one value: every rank)")
    parser.add_argument("--plant-step-mib", type=float, nargs="+", metavar="MIB",
                        help="calibration: rank r's forward also holds the r-th value in MiB until its backward "
                             "(one value: every rank)")
    alone = parser.add_argument_group("standalone (one torchrun per node)")
    alone.add_argument("--steps", type=positive(int), default=20, help="timed steps (default 20)")
    alone.add_argument("--out", type=Path, help="folder for this node's rank files (and rank 0's summary.json)")
    args = parser.parse_args(argv)
    if CONTROL_ENV not in os.environ and args.out is None:
        parser.error("--out is required unless the rank is started by a RankGroup")
    for option in ("plant_comm_ms", "plant_step_mib"):
        for value in getattr(args, option) or ():
            if not value >= 0:
                parser.error(f"--{option.replace('_', '-')}={value:g} is not allowed; it must be >= 0")
    return args


def init_rank(args: argparse.Namespace) -> Trainer:
    """Join the process group and build this rank's share of the step."""
    rank, world_size, local_rank = (int(os.environ[k]) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    if args.world_size is not None and args.world_size != world_size:
        raise ValueError(f"--world-size={args.world_size} but the launcher started WORLD_SIZE={world_size} ranks")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.device == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                            timeout=datetime.timedelta(seconds=args.pg_timeout),
                            device_id=device if device.type == "cuda" else None)
    config = StepConfig(world_size=world_size, batch=args.batch, image_size=args.image_size, seed=args.seed,
                        lr=args.lr, dtype=args.dtype, model=args.model)
    delay_ms = per_rank(args.plant_comm_ms, "--plant-comm-ms", rank, world_size)
    return make_trainer(DDP, device, config, rank=rank, comm_delay_s=None if delay_ms is None else delay_ms / 1e3,
                        held_mib=per_rank(args.plant_step_mib, "--plant-step-mib", rank, world_size))


def per_rank(values: Sequence[float] | None, option: str, rank: int, world_size: int) -> float | None:
    """This rank's value of a planting option given once for every rank or once per rank; None when not given.

    Raises:
        ValueError: neither one value nor ``world_size`` of them.
    """
    if values is None:
        return None
    if len(values) not in (1, world_size):
        raise ValueError(f"{option} has {len(values)} values; allowed: one, or one per rank ({world_size})")
    return values[rank] if len(values) > 1 else values[0]


class SleepStep:
    """A known-answer step for calibration: sleeps a planted time, through the same commands as a training step."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def step(self) -> None:
        time.sleep(self.seconds)

    def synchronize(self) -> None:
        """Nothing queued on a device."""


def setup(args: argparse.Namespace) -> Trainer | SleepStep:
    """The rank's state: its share of the training step, or the planted sleep of a calibration group."""
    if args.plant_sleep_ms is None:
        return init_rank(args)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.pg_timeout))
    return SleepStep(args.plant_sleep_ms[dist.get_rank()] / 1e3)


def _json(value: Any) -> bytes:
    return json.dumps(value).encode()


def timed(step: Callable[[], object], trainer: Trainer | SleepStep, steps: str) -> bytes:
    """``time N``: this rank's times of N steps after a barrier (`pitfalls.distributed.time_steps`); ``time_no_sync
    N`` times the step under DDP's ``no_sync()`` (no all-reduce)."""
    return _json(time_steps(step, trainer.synchronize, int(steps), barrier=dist.barrier))


def state(trainer: Trainer, _: str) -> bytes:
    """``state``: this rank's weights and momentum buffers (torch.save's bytes)."""
    buffer = io.BytesIO()
    torch.save(trainer.full_state(), buffer)
    return buffer.getvalue()


def step(trainer: Trainer, _: str) -> bytes:
    loss = trainer.step()
    trainer.synchronize()
    return _json({"loss": float(loss)})


def communication(trainer: Trainer, _: str) -> bytes:
    seconds = trainer.communication()
    assert not isinstance(seconds, Unavailable)  # a DDP rank always communicates
    return _json({"seconds": seconds})


COMMANDS: dict[str, Callable[[Any, str], bytes]] = {
    "step": step,
    "time": lambda trainer, steps: timed(trainer.step, trainer, steps),
    "time_no_sync": lambda trainer, steps: timed(trainer.step_without_communication, trainer, steps),
    "measure": lambda trainer, _: _json(asdict(trainer.measure()[0])),
    "communication": communication,
    "state": state,
    "shard": lambda trainer, _: _json(asdict(trainer.shard)),
}


def standalone(args: argparse.Namespace) -> dict[str, Any]:
    """Time ``--steps`` steps, measure, and write this rank's file (rank 0: and the summary)."""
    trainer = init_rank(args)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    device = trainer.devices[0]
    sampler = NvmlSampler(device) if device.type == "cuda" else None
    with sampler if sampler is not None else contextlib.nullcontext():
        times = time_steps(trainer.step, trainer.synchronize, args.steps, barrier=dist.barrier, warmup=2)
    [mine] = trainer.measure()
    busy = utilization(sampler.summary) if sampler is not None else Unavailable("no CUDA device")
    record = {
        **asdict(mine),
        "node_rank": int(os.environ.get("GROUP_RANK", "0")),
        "local_rank": int(os.environ["LOCAL_RANK"]),
        "step_times_s": times,
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
        step_s = step_seconds([r["step_times_s"] for r in gathered])
        summary = {
            "world_size": world_size,
            "nodes": sorted({r["host"] for r in gathered}),
            "batch_per_rank": args.batch,
            "global_batch": world_size * args.batch,
            "image_size": args.image_size,
            "model": args.model,
            "device": args.device,
            "step_s": step_s,
            "samples_per_s": world_size * args.batch / step_s,
            "ranks": gathered,
        }
        (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return record


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if CONTROL_ENV in os.environ:
        serve(lambda: setup(args), COMMANDS)
        # No destroy_process_group on failure (serve re-raises): with a peer gone it can block (nccl).
        dist.destroy_process_group()
    else:
        standalone(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

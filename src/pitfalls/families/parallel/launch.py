"""The parallel family's DDP step as a `pitfalls.distributed.RankGroup`: one rank per device, kept alive.

`DdpGroup` is what a ``ddp`` case calls: its ranks run `rank`'s command table; a step, a timed block
(`pitfalls.distributed.time_steps` in every rank, the slowest rank's median), each rank's memory, communication,
weights and shard are one command each.
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence

import torch

from pitfalls.devices import CPU_DEVICE_THREADS
from pitfalls.distributed import RankFailed, RankGroup, step_seconds
from pitfalls.distributed.launch import START_TIMEOUT_S, STEP_TIMEOUT_S
from pitfalls.families.parallel.step import RankFigures, Shard, StepConfig
from pitfalls.result import Unavailable

__all__ = ["RANK_MODULE", "DdpGroup", "RankFailed", "rank_arguments"]

RANK_MODULE = "pitfalls.families.parallel.rank"


def rank_arguments(config: StepConfig, device_type: str, threads: int) -> list[str]:
    """The rank module's command line for one step configuration."""
    return [
        "--device", device_type, "--threads", str(threads), "--world-size", str(config.world_size),
        "--batch", str(config.batch), "--image-size", str(config.image_size), "--seed", str(config.seed),
        "--lr", repr(config.lr), "--dtype", config.dtype, "--model", config.model,
    ]


class DdpGroup(RankGroup):
    """``world_size`` DDP ranks started once; calling the group runs one step on every rank.

    Args:
        config: the step each rank runs its share of.
        device_type: "cpu" (gloo ranks) or "cuda" (nccl, rank r on cuda:r).
        threads: intra-op threads per rank.
        entry: what each rank runs; the default is the family's rank module. Tests pass a script.
        extra: more arguments of the rank module (calibration: ``--plant-sleep-ms``).
        start_timeout_s: seconds for every rank to report ready.
        step_timeout_s: seconds for every rank to answer one command.

    Raises:
        RankFailed: a rank failed while starting.
    """

    def __init__(self, config: StepConfig, device_type: str, *, threads: int = CPU_DEVICE_THREADS,
                 entry: Sequence[str] = ("-m", RANK_MODULE), extra: Sequence[str] = (),
                 start_timeout_s: float = START_TIMEOUT_S, step_timeout_s: float = STEP_TIMEOUT_S) -> None:
        if device_type not in ("cpu", "cuda"):
            raise ValueError(f"device_type={device_type!r} is not allowed; allowed: cpu, cuda")
        super().__init__(entry, config.world_size, args=[*rank_arguments(config, device_type, threads), *extra],
                         threads=threads, start_timeout_s=start_timeout_s, step_timeout_s=step_timeout_s)

    @property
    def rank_pids(self) -> list[int]:
        return [p.pid for p in self.popens]

    def __call__(self) -> torch.Tensor:
        """Run one training step on every rank; return rank 0's loss, a scalar tensor as a one-process step's."""
        return torch.tensor(float(json.loads(self.run("step")[0])["loss"]))

    def times(self, calls: int, command: str = "time") -> list[list[float]]:
        """Each rank's times of ``calls`` steps, timed in the rank after a barrier, rank 0 first (``time_no_sync``:
        each step under ``no_sync()``)."""
        return [json.loads(reply) for reply in self.run(f"{command} {calls}")]

    def block(self, calls: int) -> float:
        """Seconds per step of ``calls`` steps: the slowest rank's median (`pitfalls.distributed.step_seconds`)."""
        return step_seconds(self.times(calls))

    def exposed_communication(self, calls: int) -> float:
        """Seconds of a step that communication adds: the step time minus that of the same step under
        ``no_sync()`` (no all-reduce), both by the one routine, in blocks of ``calls`` steps."""
        with_sync = self.block(calls)
        return with_sync - step_seconds(self.times(calls, "time_no_sync"))

    def measure(self) -> list[RankFigures]:
        """Every rank's time and peak memory of a step (`step.Trainer.measure`)."""
        return [RankFigures(**json.loads(reply)) for reply in self.run("measure")]

    def communication(self) -> float | Unavailable:
        """Seconds of one profiled step in which a rank's communication was in flight, averaged over the ranks."""
        seconds = [float(json.loads(reply)["seconds"]) for reply in self.run("communication")]
        return sum(seconds) / len(seconds)

    def states(self) -> list[dict[str, torch.Tensor]]:
        """Every rank's weights and momentum buffers, rank 0 first."""
        return [torch.load(io.BytesIO(reply), weights_only=True) for reply in self.run("state")]

    def shards(self) -> list[Shard]:
        """Which samples each rank trained on, rank 0 first."""
        return [Shard(**json.loads(reply)) for reply in self.run("shard")]

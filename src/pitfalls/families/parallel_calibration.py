"""Known answers for the parallel family's step time: rank groups whose ranks sleep planted times per step.

They run through the family's own path (`parallel_launch.DdpGroup.block`: the rank module's ``time`` command,
`pitfalls.distributed.time_steps` in each rank after a barrier, `pitfalls.distributed.step_seconds` over the
ranks), with the training step replaced by a sleep (``--plant-sleep-ms``). Sleeps, so that the 2 cores shared
with other work do not decide the answer.
"""

from __future__ import annotations

from pitfalls.calibration.table import CPU, SPEEDUP, Check, Reading, own_instrument
from pitfalls.families.parallel_launch import DdpGroup
from pitfalls.families.parallel_step import StepConfig
from pitfalls.probes.result import Unavailable
from pitfalls.probes.timing import blocked_speedup

__all__ = ["CHECKS", "SAMPLES_PER_SECOND_FIGURE", "SLEEPS_MS", "STEP_TIME_FIGURE", "rank_sleep_reading",
           "self_speedup_reading"]

# Rank r sleeps SLEEPS_MS[r] per step: the step must read the largest, not rank 0's.
SLEEPS_MS = (20.0, 60.0)
STEPS = 10
BLOCKS = 5
# The names `parallel.own_figures` gives the figures these checks read.
STEP_TIME_FIGURE = "step time"
SAMPLES_PER_SECOND_FIGURE = "samples per second"
STEP_TIME = own_instrument("parallel", STEP_TIME_FIGURE)
SAMPLES_PER_SECOND = own_instrument("parallel", SAMPLES_PER_SECOND_FIGURE)


def _group(sleeps_ms: tuple[float, ...]) -> DdpGroup:
    config = StepConfig(world_size=len(sleeps_ms), batch=1, image_size=4)
    return DdpGroup(config, "cpu", extra=["--plant-sleep-ms", *map(repr, sleeps_ms)])


def rank_sleep_reading(device: str) -> Reading:
    """A group whose rank r sleeps ``SLEEPS_MS[r]`` per step: the step time (ms) must read the largest."""
    planted = max(SLEEPS_MS)
    if device != CPU:
        return Reading(planted, Unavailable("the planted ranks are gloo ranks on the CPU"))
    group = _group(SLEEPS_MS)
    try:
        seconds = group.block(STEPS)
    finally:
        group.close()
    return Reading(planted, seconds * 1e3, f"{len(SLEEPS_MS)} ranks sleeping {SLEEPS_MS} ms, {STEPS} steps each")


def self_speedup_reading(device: str) -> Reading:
    """Two identical groups of ranks (separate processes) compared by blocks: the speedup must read 1.00."""
    if device != CPU:
        return Reading(1.0, Unavailable("the planted ranks are gloo ranks on the CPU"))
    first, second = _group(SLEEPS_MS), _group(SLEEPS_MS)
    try:
        result = blocked_speedup(first.block, second.block, blocks=BLOCKS, units=STEPS)
    finally:
        first.close()
        second.close()
    return Reading(1.0, result.ratio, f"{result.rounds} block pairs of {STEPS} steps")


CHECKS = (
    Check("parallel: step of ranks sleeping 20 and 60 ms", (STEP_TIME, SAMPLES_PER_SECOND), "ms", 0.10,
          rank_sleep_reading, family="parallel",
          why="a 10 ms sleep overshot by up to 2.8 ms on the loaded 2-core machine: 60 ms keeps that under 5 %"),
    Check("parallel: a rank group against itself", (SPEEDUP,), "x", 0.05,
          self_speedup_reading, family="parallel",
          why="two groups of sleeping ranks in separate processes; 5 % is the issue's bar"),
)

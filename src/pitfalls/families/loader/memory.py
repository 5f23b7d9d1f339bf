"""The loader group's peak memory during a run: the main process and every worker, sampled in the background.

A loader with workers is one program spread over several processes: its peak is the group's, read by
`GroupMemorySampler` (this process and all its descendants, every 15 ms, psutil's PSS, USS and RSS) while the
case delivers its batches, so a worker's peak while it collates is caught, not only the state between batches.
PSS sums count each shared page once; USS sums count no shared page. The cgroup's own peak is not used: on this
machine only cgroup v1's ``memory.max_usage_in_bytes`` of the whole container is there, a ceiling of everything
running in it, not the loader's figure.
"""

from __future__ import annotations

from pitfalls.devices import synchronize
from pitfalls.families.loader.steps import BatchStep
from pitfalls.probes.group_memory import GroupMemory, GroupMemorySampler, members_named

# Every 15 ms: a batch of 32 at 128 x 128 collates in tens of ms on this machine, so its peak is seen.
SAMPLE_INTERVAL_S = 0.015


def group_peak(step: BatchStep, batches: int, interval_s: float = SAMPLE_INTERVAL_S) -> GroupMemory:
    """The peak memory of the step's whole group (this process and its workers, `BatchStep.worker_pids`) over
    ``batches`` calls. Other children of this process (a resource tracker, a compile pool) are not the loader's.

    Args:
        step: a batch step, started.
        batches: synchronized calls to make while sampling.
        interval_s: seconds between samples.

    Returns:
        The sampler's figures: per-process peaks and the group's peaks of the PSS, USS and RSS sums.
    """
    with GroupMemorySampler(interval_s=interval_s, members=members_named(step.worker_pids)) as sampler:
        for _ in range(batches):
            step()
            synchronize(step.device)
    return sampler.result

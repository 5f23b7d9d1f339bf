"""Measurement probes: each a small function or context manager, usable on its own and testable on the CPU.

A figure that cannot be measured here is an `Unavailable` carrying the reason, never a 0.
"""

from pitfalls.probes.compiled import compile_failure_reason
from pitfalls.probes.figures import ProbeFigure, probe_case, render
from pitfalls.probes.nvml import NvmlSummary
from pitfalls.probes.syncs import HazardCounts, count_cuda_syncs, count_hazards
from pitfalls.probes.timing import blocked_speedup, cuda_event_time, wall_time
from pitfalls.result import Unavailable

__all__ = [
    "HazardCounts", "NvmlSummary", "ProbeFigure", "Unavailable", "blocked_speedup", "compile_failure_reason",
    "count_cuda_syncs", "count_hazards", "cuda_event_time", "probe_case", "render", "wall_time",
]

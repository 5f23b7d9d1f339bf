"""Measurement probes: each a small function or context manager, usable on its own and testable on the CPU.

A figure that cannot be measured here is an `Unavailable` carrying the reason, never a 0.
"""

from pitfalls.probes.compiled import (
    CompileReport,
    FirstCall,
    GraphBreak,
    compile_failure_reason,
    compile_probe,
    first_call,
    reset_dynamo,
)

# Exported as environment_facts: `pitfalls.probes.environment` stays the module, importable by its dotted path.
from pitfalls.probes.environment import environment as environment_facts
from pitfalls.probes.figures import ProbeFigure, probe_case, render
from pitfalls.probes.group_memory import GroupMemory, GroupMemorySampler, ProcessPeak
from pitfalls.probes.nvml import (
    MetricSummary,
    NvmlSampler,
    NvmlSummary,
    NvmlTarget,
    nvml_target,
    nvml_unavailable_reason,
)
from pitfalls.probes.sites import CallSite, HazardLocator, HazardSite, LocatedHazards, SourceLine
from pitfalls.probes.syncs import (
    HazardCounts,
    SyncCount,
    SyncHazardCounter,
    count_cuda_syncs,
    count_hazards,
    hazard_label,
)
from pitfalls.probes.timing import (
    CudaEventTiming,
    Speedup,
    WallTiming,
    blocked_speedup,
    case_speedup,
    cuda_event_time,
    interleaved_speedup,
    wall_time,
)
from pitfalls.probes.trace import TraceResult, export_trace, hazard_ranges
from pitfalls.result import Unavailable, is_available

__all__ = [
    "CallSite",
    "CompileReport",
    "CudaEventTiming",
    "FirstCall",
    "GraphBreak",
    "GroupMemory",
    "GroupMemorySampler",
    "HazardCounts",
    "HazardLocator",
    "HazardSite",
    "LocatedHazards",
    "MetricSummary",
    "NvmlSampler",
    "NvmlSummary",
    "NvmlTarget",
    "ProcessPeak",
    "ProbeFigure",
    "Speedup",
    "SourceLine",
    "SyncCount",
    "SyncHazardCounter",
    "TraceResult",
    "Unavailable",
    "WallTiming",
    "blocked_speedup",
    "case_speedup",
    "compile_failure_reason",
    "compile_probe",
    "count_cuda_syncs",
    "count_hazards",
    "cuda_event_time",
    "environment_facts",
    "export_trace",
    "first_call",
    "hazard_label",
    "hazard_ranges",
    "interleaved_speedup",
    "is_available",
    "nvml_target",
    "nvml_unavailable_reason",
    "probe_case",
    "render",
    "reset_dynamo",
    "wall_time",
]

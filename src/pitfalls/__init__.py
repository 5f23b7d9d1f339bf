"""pitfalls: PyTorch performance pitfalls, naive and optimized, measured side by side."""

from pitfalls.cases import Case, SkipCase, build_case
from pitfalls.devices import available_devices, cuda_available, resolve_device, synchronize
from pitfalls.equivalence import Comparison, check_all
from pitfalls.families.loss import SegNet, TrainConfig, make_loss, make_train_step
from pitfalls.registry import Family, baseline, families, variants
from pitfalls.families.sampler import SampleResult, SamplerConfig, make_sample_call, sample
from pitfalls.guard import SyncHazardError, no_sync_hazards

__all__ = [
    "Case",
    "Comparison",
    "Family",
    "SampleResult",
    "SamplerConfig",
    "SegNet",
    "SkipCase",
    "SyncHazardError",
    "TrainConfig",
    "available_devices",
    "baseline",
    "build_case",
    "check_all",
    "cuda_available",
    "families",
    "make_loss",
    "make_sample_call",
    "make_train_step",
    "no_sync_hazards",
    "resolve_device",
    "sample",
    "synchronize",
    "variants",
]

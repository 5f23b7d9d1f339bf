"""pitfalls: PyTorch performance pitfalls, naive and optimized, measured side by side."""

from pitfalls.cases import build_case, smoke_case
from pitfalls.devices import available_devices, cuda_available, resolve_device, synchronize
from pitfalls.doctor import DoctorOptions, DoctorReport, run_doctor
from pitfalls.equivalence import check_all, same_output
from pitfalls.families.loss import SegNet, TrainConfig, make_loss, make_train_step
from pitfalls.families.sampler import SamplerConfig, SampleResult, make_sample_call, sample
from pitfalls.family import FLOOR, Case, Comparison, Family, Param, SkipCase
from pitfalls.hazard_guard import SyncHazardError, no_sync_hazards
from pitfalls.registry import all_families, baseline, family_names, variants
from pitfalls.registry import family as family_entry  # `pitfalls.family` is the module of Family and Case

__all__ = [
    "FLOOR",
    "Case",
    "Comparison",
    "DoctorOptions",
    "DoctorReport",
    "Family",
    "Param",
    "SampleResult",
    "SamplerConfig",
    "SegNet",
    "SkipCase",
    "SyncHazardError",
    "TrainConfig",
    "all_families",
    "available_devices",
    "baseline",
    "build_case",
    "check_all",
    "cuda_available",
    "family_entry",
    "family_names",
    "make_loss",
    "make_sample_call",
    "make_train_step",
    "no_sync_hazards",
    "resolve_device",
    "run_doctor",
    "same_output",
    "sample",
    "smoke_case",
    "synchronize",
    "variants",
]

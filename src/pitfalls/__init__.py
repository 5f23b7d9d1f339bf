"""pitfalls: PyTorch performance pitfalls, naive and optimized, measured side by side."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

# Where each public name is defined, imported on its first use: every module of the package imports this one first,
# and a process that needs one of them (a rank of a process group, a benchmark's worker) would otherwise import every
# family, the doctor and rich as well: half a CPU second more per process, on top of torch's own second.
_HOMES = {
    "cases": ("build_case", "smoke_case"),
    "devices": ("available_devices", "cuda_available", "resolve_device", "synchronize"),
    "doctor": ("DoctorOptions", "DoctorReport", "run_doctor"),
    "equivalence": ("check_all", "same_output"),
    "families.loss": ("SegNet", "TrainConfig", "make_loss", "make_train_step"),
    "families.sampler": ("SamplerConfig", "SampleResult", "make_sample_call", "sample"),
    "family": ("FLOOR", "Case", "Comparison", "Family", "Param", "SkipCase"),
    "hazard_guard": ("SyncHazardError", "no_sync_hazards"),
    "registry": ("all_families", "baseline", "family_names", "variants"),
}
_WHERE = {name: (f"pitfalls.{module}", name) for module, names in _HOMES.items() for name in names}
_WHERE["family_entry"] = ("pitfalls.registry", "family")


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first use."""
    if name not in _WHERE:
        raise AttributeError(f"module 'pitfalls' has no attribute {name!r}")
    module, attribute = _WHERE[name]
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})

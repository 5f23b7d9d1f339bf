"""A case is one runnable workload: a family's variant (or floor) with its parameters, device and compile choice.

The asv suite, the pytest-benchmark tests, the probes and the CLI all build their workloads here, through the
family's entry, so every one of them measures the same thing on the same seeded inputs.
"""

from __future__ import annotations

from typing import Any

from pitfalls.family import Case, SkipCase
from pitfalls.registry import family as family_entry

__all__ = ["Case", "SkipCase", "build_case", "smoke_case"]


def build_case(family: str, variant: str, *, device: str = "cpu", compiled: bool = False, **params: Any) -> Case:
    """Build one case on seeded inputs.

    Args:
        family: a registered family (see `pitfalls.family_names()`).
        variant: one of the family's variants, or ``"floor"``.
        device: ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
        compiled: wrap the workload in ``torch.compile`` (compiled lazily, on the first call).
        **params: the family's parameters (see `pitfalls list`); missing ones take their defaults.

    Returns:
        The case, ready to call.

    Raises:
        ValueError, TypeError: an unknown family, variant or parameter, or a value a parameter does not allow.
        SkipCase: the device is absent or the case would not fit in its memory.
    """
    return family_entry(family).build(variant, device=device, compiled=compiled, **params)


def smoke_case(family: str, variant: str, *, device: str = "cpu") -> Case:
    """Build one case at the family's smoke size: small, for checks that do not depend on size."""
    entry = family_entry(family)
    return entry.build(variant, device=device, **entry.smoke)

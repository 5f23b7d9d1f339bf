"""Does each optimized variant give the naive variant's answer? The gate every benchmark stands on.

Each family's entry carries its comparer: the loss is deterministic, so its variants must agree in value and
gradient; the sampler is random, so its variants must agree in what is determined (how many positives and
negatives each row gets) and each must obey the rules. A family with deterministic outputs can use
`same_output`, which compares what one call of each case returns. The floor is a reference, not a variant: the
gate does not apply to it.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.utils._pytree as pytree

from pitfalls.devices import resolve_device
from pitfalls.family import Comparison, Family
from pitfalls.registry import all_families

__all__ = ["Comparison", "check_all", "same_output"]


def _leaves(output: Any) -> list[torch.Tensor]:
    return [torch.as_tensor(leaf) for leaf in pytree.tree_leaves(output)]


def same_output(family: Family, variant: str, device: torch.device) -> Comparison:
    """Compare what one call of a variant returns with the naive variant's, at the family's smoke size.

    For families whose cases are deterministic and return their result (tensors, or tuples and dicts of them):
    every leaf must match in shape and value (``torch.testing.assert_close``'s default tolerances).
    """
    want = _leaves(family.build(family.baseline, device=str(device), **family.smoke)())
    got = _leaves(family.build(variant, device=str(device), **family.smoke)())
    if len(got) != len(want):
        return Comparison(family.name, variant, str(device), False, float("inf"),
                          f"returns {len(got)} values, naive returns {len(want)}")
    worst = 0.0
    for index, (g, w) in enumerate(zip(got, want, strict=True)):
        try:
            torch.testing.assert_close(g, w)
        except AssertionError as error:
            first = (str(error).strip().splitlines() or [""])[0]
            return Comparison(family.name, variant, str(device), False, float("inf"), f"value {index}: {first}")
        if g.numel():
            worst = max(worst, float((g.double() - w.double()).abs().max()))
    return Comparison(family.name, variant, str(device), True, worst)


def check_all(devices: tuple[str, ...], families: tuple[str, ...] | None = None) -> list[Comparison]:
    """Compare every registered variant of every family (or of ``families``) with its naive variant on each device.

    Args:
        devices: the devices to run on.
        families: the families to check, by name (None: every registered family).

    Returns:
        One `Comparison` per variant and device.
    """
    registered = all_families()
    unknown = [name for name in families or () if name not in registered]
    if unknown:
        raise ValueError(f"family {unknown[0]!r} is not registered; allowed: {', '.join(registered)}")
    return [
        entry.compare(variant, resolve_device(device))
        for device in devices
        for entry in registered.values()
        if families is None or entry.name in families
        for variant in entry.variants
    ]

"""A user's own pitfall family: a masked sum by ``.item()`` in a Python loop against one tensor reduction.

Each ``.item()`` copies one value to the host and, on a GPU, waits for every kernel queued before it; the loop
does that once per element. The tensor form computes the same sum on the device with no sync at all.
"""

from __future__ import annotations

from typing import Any

import torch

from pitfalls import FLOOR, Case, Family, Param, same_output

THRESHOLD = 0.5


def loop_sum(values: torch.Tensor) -> torch.Tensor:
    """Sum the values above the threshold, one ``.item()`` per element (a sync each on a GPU)."""
    total = values.new_zeros(())
    for value in values:
        if value.item() > THRESHOLD:
            total = total + value
    return total


def tensor_sum(values: torch.Tensor) -> torch.Tensor:
    """The same sum as one reduction on the device: no value ever reaches the host."""
    return torch.where(values > THRESHOLD, values, 0.0).sum()


def floor_sum(values: torch.Tensor) -> torch.Tensor:
    """The floor: one plain reduction over the same values, the least the job can cost."""
    return values.sum()


FUNCTIONS = {"loop": loop_sum, "tensor": tensor_sum, FLOOR: floor_sum}


def build(variant: str, device: torch.device, compiled: bool, params: dict[str, Any]) -> Case:
    generator = torch.Generator().manual_seed(0)
    # float64, so that the loop's and the reduction's orders of summation agree to the last bits that matter.
    values = torch.randn(params["n"], generator=generator, dtype=torch.float64).to(device)
    fn = FUNCTIONS[variant]
    run = torch.compile(fn) if compiled else fn
    return Case(FAMILY.name, variant, device, compiled, params, lambda: run(values), fn, (values,))


FAMILY = Family(
    name="item_loop",
    article="user",
    summary=".item() in a Python loop (a sync per element) against one tensor reduction",
    variants=("loop", "tensor"),
    params=(Param("n", 1_000, "values summed per call"),),
    builder=build,
    estimate=lambda params: 16 * params["n"],
    comparer=same_output,
    smoke={"n": 100},
    grids={"quick": {"n": (1_000,)}, "full": {"n": (1_000, 100_000)}},
    article_sizes=({"n": 100_000},),
)

"""What the loader's calibration rows share: tiny items, a loader step over a planted data set, a row."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import Dataset, default_collate

from pitfalls.families.loader.entry import ENTRY, NAME
from pitfalls.families.loader.steps import Consume, LoaderStep, make_step
from pitfalls.known.table import Check, Reading, own_instrument

__all__ = ["Items", "row", "step"]


class Items(Dataset[tuple[Tensor, Tensor]]):
    """``items`` planted items of the ``uint8`` rung's form: image [3, S, S] of ``index % 251``, mask [S, S] of labels
    0 and 1, S = ``size``; a subclass plants a cost in them."""

    size = 8

    def __init__(self, items: int) -> None:
        self.items = items

    def __len__(self) -> int:
        return self.items

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        return (torch.full((3, self.size, self.size), index % 251, dtype=torch.uint8),
                torch.full((self.size, self.size), index % 2, dtype=torch.uint8))


def step(dataset: Dataset[Any], device: str = "cpu", *, start: bool = True, measure_uss: bool = False,
         consume: Consume | None = None, **sizes: Any) -> LoaderStep:
    """A ``uint8`` loader step whose data set is ``dataset`` (all its items), through the loader's own code path.

    Args:
        dataset: the planted data set.
        device: where batches are delivered.
        start: start the iterator and the workers now.
        measure_uss: workers record their USS (the copy-on-write figure).
        consume: replaces the model step (see `BatchStep`).
        **sizes: the family's parameters; more workers than cores are allowed (the plants sleep or hold memory).
    """
    where, params = ENTRY.place("uint8", device, {**sizes, "items": len(dataset)})  # type: ignore[arg-type]
    made = make_step("uint8", where, params, check_cores=False, start=start, measure_uss=measure_uss,
                     consume=consume, source=(dataset, default_collate))
    assert isinstance(made, LoaderStep)
    return made


def row(name: str, figure: str, unit: str, tolerance: float, measure: Callable[[str], Reading], why: str,
        **options: Any) -> Check:
    """A calibration row of the loader family that reads its own ``figure`` (`own_instrument`)."""
    return Check(name, (own_instrument(NAME, figure),), unit, tolerance, measure, family=NAME, why=why, **options)

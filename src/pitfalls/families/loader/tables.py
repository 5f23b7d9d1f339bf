"""A figure of every parameter set of an asv class, measured in one process, each case live alone."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any, TypeVar

from pitfalls.family import SkipCase

__all__ = ["case_table"]

T = TypeVar("T")


def case_table(measure: Callable[..., T], param_names: list[str], params: list[list[Any]]) -> dict[tuple[Any, ...],
                                                                                               T | str]:
    """``measure(variant, device, **sizes)`` of every parameter set, or the reason a set cannot be measured here.

    Args:
        measure: builds its own case, measures it and closes it (so no two cases are live at once).
        param_names: asv's axes: ``variant``, ``device`` and the family's parameters.
        params: their values.

    Returns:
        The figures by the tuple of values asv passes, or the SkipCase reason.
    """
    table: dict[tuple[Any, ...], T | str] = {}
    for values in itertools.product(*params):
        named = dict(zip(param_names, values, strict=True))
        variant, device = named.pop("variant"), named.pop("device")
        try:
            table[values] = measure(variant, device, **named)
        except SkipCase as skip:
            table[values] = skip.reason
    return table

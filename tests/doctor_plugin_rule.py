"""A rule of the doctor's defined outside the package, with its own instrument, plant and twin: a full sort of a
tensor whose first few values alone are used, where topk would do. Registered by ``PITFALLS_RULES=this_file:RULE``."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from pitfalls.doctor import Hit, Plant, Rule
from pitfalls.probes.sites import locate_dispatch, source_line

SCRIPT = Path(__file__).resolve().parent / "doctor_examples" / "sorted_head.py"


class SortWatch(TorchDispatchMode):
    """Count each full sort during the scanned steps, by the script's line."""

    def __init__(self, _context: object) -> None:
        super().__init__()
        self.sorts: Counter[tuple[str, int, str] | None] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        if func.overloadpacket is torch.ops.aten.sort:
            self.sorts[locate_dispatch(skip=(__file__,))[0]] += 1
        return func(*args, **(kwargs or {}))


def find(seen):  # noqa: ANN001, ANN201
    watch, steps = seen.scanned(SortWatch)
    if watch is None:
        return []
    return [Hit("a full sort", source_line(key), count / steps) for key, count in watch.sorts.items()]


RULE = Rule(
    "full sort for the top values", "rule", "torch.sort of a whole tensor whose first few values alone are used",
    "torch.topk(x, k): a partial selection, not a full sort", "a rule of this test's own",
    "the sorts of the scanned steps", find, Plant.of(SCRIPT, "torch.sort(scores", "torch.topk(scores"), SortWatch)

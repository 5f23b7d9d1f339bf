"""The loader's rules: the wait in the DataLoader's ``next()`` over the timed steps, judged by the loader family's
verdict, and each loader's batch against its smallest lossless dtypes, at the script's line that asks for it.
"""

from __future__ import annotations

from collections.abc import Callable

from pitfalls.doctor import planted
from pitfalls.doctor.copies import HOST_TO_DEVICE
from pitfalls.doctor.records import Seen
from pitfalls.doctor.rule import Hit, Plant, Rule, ScriptLine
from pitfalls.families.loader.verdict import WAIT_THRESHOLD, Bound
from pitfalls.units import human_bytes

__all__ = ["BOUND", "KEEPS_UP", "RULES", "WIDE"]

_SOURCE = "article 001 (find the bottleneck; workers, data in RAM, offline preprocessing), judged by the loader " \
          "family's verdict"
_TRAIN_LOADER = ScriptLine(planted.TRAIN, "for x, y in loader:", planted.TRAIN_ARGS)
_RULES_LOADER = ScriptLine(planted.RULES, "for images, labels in DataLoader(")


def _waits(verdict: Bound) -> Callable[[Seen], list[Hit]]:
    def find(seen: Seen) -> list[Hit]:
        figures = seen.loader
        if figures is None or figures.verdict != verdict:
            return []
        return [Hit(f"the DataLoader: waits {figures.ms_per_step:.3g} ms a step in next() ({figures.wait_share:.0%} "
                    f"of the step): {figures.verdict}", seen.loader_line, figures.batches_per_step,
                    figures.ms_per_step, "measured: the wait in next() over the timed steps")]

    return find


def _wide(seen: Seen) -> list[Hit]:
    scan = seen.scan
    if scan is None or scan.steps == 0:
        return []
    hits = []
    for line, shape in scan.anatomies.items():
        if shape.bytes_if_smaller >= shape.bytes_per_batch:
            continue
        per_step = scan.batches[line] / scan.steps
        saved = (shape.bytes_per_batch - shape.bytes_if_smaller) * per_step
        changes = ", ".join(f"{t.path} {t.dtype} -> {t.smaller_dtype}" for t in shape.tensors
                            if t.bytes_if_smaller < t.bytes)
        if seen.bandwidth is None:
            ms, cost = None, f"not measured: {seen.no_gpu}"
        else:
            ms = saved / seen.bandwidth.rate(HOST_TO_DEVICE, False) * 1e3
            cost = "estimated: the bytes saved over the pageable host-to-device bandwidth measured on the device"
        hits.append(Hit(f"the batch ships {human_bytes(shape.bytes_per_batch)}; {human_bytes(shape.bytes_if_smaller)} "
                        f"in its smallest lossless dtypes ({changes})", line, per_step, ms, cost))
    return hits


BOUND = Rule(
    "loader-bound", "loader",
    f"the step waits for the DataLoader in next() more than {WAIT_THRESHOLD:.0%} of its time",
    "load the next batches while the step runs: DataLoader(num_workers > 0, persistent_workers=True, "
    "pin_memory=True) with .to(device, non_blocking=True); with workers already, more of them (up to the cores), "
    "less work per item (decode and resize once, before training) and smaller dtypes; `pitfalls doctor --try "
    "loader` measures the settings on this script", _SOURCE, "the wait in next() over the timed steps",
    _waits("loader-bound"), Plant(_TRAIN_LOADER, _RULES_LOADER))
KEEPS_UP = Rule(
    "loader keeps up", "loader",
    f"the DataLoader's wait in next(), {WAIT_THRESHOLD:.0%} of the step or less: it keeps up (step-bound)",
    "nothing to change here: the loader keeps up with the step (step-bound)", _SOURCE,
    "the wait in next() over the timed steps", _waits("step-bound"), Plant(_RULES_LOADER, _TRAIN_LOADER))
WIDE = Rule(
    "batch in wide dtypes", "memory",
    "a batch whose tensors fit, losslessly, in smaller dtypes (int64 labels and masks that fit in uint8, float32 "
    "images of whole numbers): more bytes copied and held than needed",
    "ship the batch in its smallest lossless dtypes (uint8 images and masks, small-int labels) and convert on the "
    "device", "article 001 (uint8 images and masks: 167 MB to 33 MB per batch)",
    "the batches of the scanned steps, by the line that asks for them (scan-loader's batch anatomy)", _wide,
    Plant.of(planted.RULES, "for images, labels in DataLoader(", "(weight,) = next(weights)"))
RULES = (BOUND, KEEPS_UP, WIDE)

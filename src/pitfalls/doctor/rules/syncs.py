"""The sync rules: one a class of sync hazard (`pitfalls.probes.rewrites.CLASSES`), read by the hazard counter of the
scanned steps by line; on a GPU each costs the host's measured wait in the syncing call (docs/doctor.md, "The rules").
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from pitfalls.doctor.planted import GPU_PATH
from pitfalls.doctor.planted import RULES as SCRIPT
from pitfalls.doctor.reasons import NO_CPU_COST
from pitfalls.doctor.records import Seen
from pitfalls.doctor.rule import Hit, Plant, Rule
from pitfalls.probes import rewrites
from pitfalls.probes.rewrites import HazardClass
from pitfalls.probes.sites import HazardSite

__all__ = ["RULES"]

_NSIGHT = "Nsight Systems' expert rules: synchronous memcpy and memset"
_TAGS = "PyTorch's op tags (dynamic_output_shape, data_dependent_output), as `pitfalls scan` reads them"
# The peer's rule or the article each class follows, where it is not the op tags alone.
_SOURCES = {
    rewrites.NONZERO: "article 004 (the sampler's nonzero) and PyTorch's op tags",
    rewrites.MASK: "article 000 (the loss's boolean masks) and PyTorch's op tags",
    rewrites.UNIQUE: "article 000 (the loss's torch.unique) and PyTorch's op tags",
    rewrites.TO_HOST: _NSIGHT,
    rewrites.FILL_TO_DEVICE: "PyTorch's profiler pattern matcher (torch.profiler._pattern_matcher): "
                             "ExtraCUDACopyPattern",
    rewrites.DATA_TO_DEVICE: _NSIGHT,
    rewrites.ELEMENT_WRITE: _NSIGHT,
    rewrites.INF_CHECK: "torch/amp/grad_scaler.py (GradScaler._maybe_opt_step reads found_inf with .item() unless the "
                        "optimizer has _step_supports_amp_scaling)",
    rewrites.GET_SCALE: "torch/amp/grad_scaler.py (GradScaler.get_scale: 'incurs a CPU-GPU sync')",
}
# Each class's planted line in the rules script, and its twin done right.
_PLANTS = {
    rewrites.NONZERO: ("picked = torch.nonzero(scores > 0)", "counted = torch.count_nonzero(scores > 0)"),
    rewrites.MASK: ("positive = scores[scores > 0]", "masked = torch.where(scores > 0, scores, 0.0)"),
    rewrites.UNIQUE: ("classes = torch.unique(labels)", "ordered = torch.sort(labels).values"),
    rewrites.SCALAR: ("seen += scores.sum().item()", "kept += scores.sum()"),
    rewrites.TO_HOST: ("logged = scores[:2].tolist()", "copied = scores[:2].clone()"),
    rewrites.SHAPE: ("binned = torch.bincount(labels)", "summed = torch.zeros(CLASSES, device=device)"),
    rewrites.FILL_TO_DEVICE: ("noise = torch.randn(BATCH, CLASSES).to(device)",
                              "jitter = torch.randn(BATCH, CLASSES, device=device)"),
    rewrites.DATA_TO_DEVICE: ("labels = labels.to(device)", "weight = weight.to(device, non_blocking=True)"),
    rewrites.ELEMENT_WRITE: ("buffer[:2] = host_labels[:2]", "buffer[2:4] = labels[2:4]"),
    rewrites.HOST_VALUE: ("buffer[order] = 1.0", "buffer[order] = torch.full((), 2.0, device=device)"),
    rewrites.NUMPY: ("as_array = scores.numpy()", "host_array = host_labels.numpy()"),
    rewrites.REPEAT: ("repeated = torch.repeat_interleave(scores, counts)",
                      "sized = torch.repeat_interleave(scores, counts, output_size"),
}
# GradScaler's own reads, planted in the GPU path's script (written for CUDA).
_GPU_PATH_PLANTS = {
    rewrites.INF_CHECK: ("scaler.step(slow)", "scaler.step(fused)"),
    rewrites.GET_SCALE: ("current = scaler.get_scale()", "initial = scaler.get_scale()"),
}


def _plant(hazard: HazardClass) -> Plant:
    if hazard in _GPU_PATH_PLANTS:
        return Plant.of(GPU_PATH, *_GPU_PATH_PLANTS[hazard])
    return Plant.of(SCRIPT, *_PLANTS[hazard])


def _call_sites(site: HazardSite, step_functions: frozenset[tuple[str, str]]) -> tuple[tuple[str, int], ...]:
    """The step's lines that reach a hazard inside a helper (none when the hazard is in the step itself)."""
    if site.line is None or (site.line.path, site.line.function) in step_functions:
        return ()
    counts: Counter[tuple[str, int]] = Counter()
    for call in site.call_sites:
        if not call.frames:
            continue
        in_step = [f for f in call.frames if (f.path, f.function) in step_functions]
        frame = in_step[0] if in_step else call.frames[0]
        counts[(frame.path, frame.lineno)] += call.count
    return tuple(where for where, _ in counts.most_common())


def _finder(hazard: HazardClass) -> Callable[[Seen], list[Hit]]:
    def find(seen: Seen) -> list[Hit]:
        scan = seen.scan
        if scan is None or scan.steps == 0:
            return []
        per_line: Counter[tuple[str, int]] = Counter()
        for site in scan.hazards.sites:
            if site.line is not None:
                per_line[(site.line.path, site.line.lineno)] += site.count
        stalls = seen.gpu.per_line if seen.gpu is not None and seen.gpu.steps else None
        hits = []
        for site in scan.hazards.sites:
            if site.kind.hazard != hazard:
                continue
            key = (site.line.path, site.line.lineno) if site.line is not None else ("", 0)
            if stalls is None:
                ms, cost = None, NO_CPU_COST
            else:
                # A line's stall is timed as a whole; its hazards of several kinds share it by count.
                stall = stalls.get(key, (0.0, 0.0))[1]
                ms = stall * site.count / per_line[key] if per_line[key] else stall
                cost = "measured: the host's wait in the syncing call on the GPU"
            hits.append(Hit(site.kind.op, site.line, site.count / scan.steps, ms, cost,
                            _call_sites(site, seen.step_functions)))
        return hits

    return find


RULES = tuple(
    Rule(hazard.name, "sync", hazard.finds, hazard.rewrite, _SOURCES.get(hazard, _TAGS),
         "the sync-hazard counter of the scanned steps, by line", _finder(hazard), _plant(hazard),
         where="CPU or GPU; costs measured on a GPU", gated=True)
    for hazard in rewrites.CLASSES
)

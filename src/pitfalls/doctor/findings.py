"""The findings of a run, one per cost of the step, each with its fix, built from what the phases measured: the
loader's wait (with the loader family's verdict), each sync hazard line, each non-blocking copy, each graph break and
recompile, the batch's bytes against its smallest lossless dtypes (docs/doctor.md, "The report", tables each kind
and its cost). Ranked by cost per step: those measured first, the costliest first; the rest by how often per step.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from linecache import getline

from pitfalls.doctor.copies import HOST_TO_DEVICE, CopySite
from pitfalls.doctor.gpu import Bandwidth
from pitfalls.doctor.phases import Timed
from pitfalls.doctor.report import CopyRow, Finding, LoaderFigures, line_fields
from pitfalls.families.loader.verdict import Verdict
from pitfalls.probes.anatomy import Anatomy
from pitfalls.probes.compiled import GraphBreakSite, Recompile
from pitfalls.probes.sites import HazardSite, LocatedHazards, SourceLine
from pitfalls.units import human_bytes

__all__ = [
    "NO_CPU_COST", "compile_findings", "copy_findings", "copy_rows", "loader_figures", "loader_finding",
    "memory_findings", "rank", "sync_findings",
]

NO_CPU_COST = "cost not measurable on a CPU"
_NO_WORKERS_FIX = ("load the next batches while the step runs: DataLoader(num_workers > 0, "
                   "persistent_workers=True, pin_memory=True) with .to(device, non_blocking=True); `pitfalls "
                   "scan-loader` times each setting on this loader")
_WORKERS_FIX = ("its {workers} workers do not keep up: more workers (up to the cores), less work per item (decode "
                "and resize once, before training), smaller dtypes; `pitfalls scan-loader` times each setting on this "
                "loader")
_STEP_BOUND_FIX = "nothing to change here: the loader keeps up with the step (step-bound)"
_RECOMPILE_FIX = ("give the changing size one value (pad or drop the last partial batch), or compile it dynamic: "
                  "torch._dynamo.mark_dynamic(x, dim) or torch.compile(..., dynamic=True)")
_BREAK_FIX = "rewrite the line so dynamo can trace it, or move it out of the compiled function"


def loader_figures(timed: Timed, anatomy: Anatomy | None) -> LoaderFigures | None:
    """The loader's figures over the timed steps, or None when they took no batch."""
    if not timed.step_s or sum(timed.batches) == 0:
        return None
    step_s, wait_s = statistics.fmean(timed.step_s), statistics.fmean(timed.wait_s)
    verdict = Verdict(sum(timed.wait_s) / sum(timed.step_s), step_s, wait_s, timed.workers)
    tensors = tuple(
        {"tensor": t.path, "shape": list(t.shape), "dtype": t.dtype, "bytes": t.bytes,
         "smallest_lossless": t.smaller_dtype, "bytes_then": t.bytes_if_smaller, "how": t.how}
        for t in (anatomy.tensors if anatomy is not None else ())
    )
    return LoaderFigures(
        wait_share=verdict.wait_share, ms_per_step=wait_s * 1e3, verdict=verdict.bound,
        batch_bytes=anatomy.bytes_per_batch if anatomy is not None else None,
        batches_per_step=statistics.fmean(timed.batches), workers=timed.workers, anatomy=tensors,
    )


def loader_finding(figures: LoaderFigures, line: SourceLine | None) -> Finding:
    """The loader's wait as a finding."""
    bound = figures.verdict == "loader-bound"
    return Finding(
        **line_fields(line), kind="loader",
        title=f"the DataLoader: waits {figures.ms_per_step:.3g} ms a step in next() ({figures.wait_share:.0%} of "
              f"the step): {figures.verdict}",
        per_step=figures.batches_per_step, ms_per_step=figures.ms_per_step,
        cost="measured: the wait in next() over the timed steps",
        fix=(_STEP_BOUND_FIX if not bound else _WORKERS_FIX.format(workers=figures.workers) if figures.workers
             else _NO_WORKERS_FIX),
    )


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


def sync_findings(located: LocatedHazards | None, steps: int, step_functions: frozenset[tuple[str, str]],
                  stalls: dict[tuple[str, int], float] | None) -> list[Finding]:
    """Each hazard line of the scanned steps as a finding; ``stalls`` (ms per step by line) on a GPU."""
    if located is None or steps == 0:
        return []
    per_line: Counter[tuple[str, int]] = Counter()
    for site in located.sites:
        if site.line is not None:
            per_line[(site.line.path, site.line.lineno)] += site.count
    found = []
    for site in located.sites:
        key = (site.line.path, site.line.lineno) if site.line is not None else ("", 0)
        if stalls is None:
            ms, cost = None, NO_CPU_COST
        else:
            # A line's stall is timed as a whole; its hazards of several kinds share it by count.
            ms = stalls.get(key, 0.0) * site.count / per_line[key] if per_line[key] else stalls.get(key, 0.0)
            cost = "measured: the host's wait in the syncing call on the GPU"
        found.append(Finding(
            **line_fields(site.line), kind="sync", title=site.kind.op, per_step=site.count / steps,
            call_sites=_call_sites(site, step_functions), ms_per_step=ms, cost=cost, fix=site.kind.rewrite))
    return found


def copy_rows(copies: Sequence[CopySite], steps: int) -> tuple[CopyRow, ...]:
    """Every copy of the scanned steps, per step."""
    if steps == 0:
        return ()
    return tuple(
        CopyRow(**line_fields(site.line), call=site.call, direction=site.direction, pinned=site.pinned,
                blocking=site.blocking, per_step=site.count / steps, bytes_per_step=site.bytes / steps)
        for site in copies
    )


def copy_findings(copies: Sequence[CopySite], steps: int, bandwidth: Bandwidth | None, no_gpu: str) -> list[Finding]:
    """Each non-blocking copy as a finding (a blocking one is a sync, found by the hazard counter); ``no_gpu`` says
    why its cost is not measured when ``bandwidth`` is None."""
    found = []
    for site in copies:
        if site.blocking or steps == 0:
            continue
        per_step = site.bytes / steps
        memory = "pinned" if site.pinned else "pageable"
        if bandwidth is None:
            ms, cost = None, f"not measured: {no_gpu}"
        else:
            ms = per_step / bandwidth.rate(site.direction, site.pinned) * 1e3
            cost = f"estimated: bytes over the {memory} {site.direction} bandwidth measured on the device"
        if site.made_by:
            fix = (f"make it on the device: {site.made_by}(..., device=device) fills it there, with no copy and no "
                   "host memory to pin")
        elif site.pinned:
            fix = "copy fewer bytes (smaller dtypes, see memory) or overlap the copy with the step's work"
        elif site.direction == HOST_TO_DEVICE:
            fix = ("pin the host memory (DataLoader(pin_memory=True), or .pin_memory()): from pageable memory the "
                   "driver stages a non-blocking copy and it does not overlap the step")
        else:
            fix = "copy into a pinned buffer (torch.empty(..., pin_memory=True)) so the copy overlaps the step"
        found.append(Finding(
            **line_fields(site.line), kind="copy",
            title=f"{site.direction} copy of {human_bytes(per_step)} a step ({site.call}, {memory}, non-blocking)"
                  + (f" of a tensor {site.made_by} made on the host" if site.made_by else ""),
            per_step=site.count / steps, ms_per_step=ms, cost=cost, fix=fix))
    return found


def compile_findings(breaks: Sequence[GraphBreakSite], recompiles: Sequence[Recompile], timed: Timed) -> list[Finding]:
    """Each graph break, and each recompile met during the timed steps, as a finding."""
    found = [
        Finding(kind="compile", title=f"graph break: {b.reason}", path=b.path, line=b.line,
                code=getline(b.path, b.line).strip(), fix=b.hint or _BREAK_FIX,
                cost="not measured: what a break costs a step needs the step without it")
        for b in breaks
    ]
    steps = len(timed.step_s)
    during: dict[tuple[str, str, str], list[Recompile]] = {}
    for r in recompiles:
        if steps and timed.during(r.started):
            during.setdefault((r.function, r.path, r.reason), []).append(r)
    for (function, path, reason), seen in during.items():
        found.append(Finding(
            kind="compile", title=f"recompile of {function}: {reason}", path=path,
            per_step=len(seen) / steps, ms_per_step=sum(r.seconds for r in seen) * 1e3 / steps,
            cost="measured: compile seconds during the timed steps", fix=_RECOMPILE_FIX))
    return found


def memory_findings(anatomy: Anatomy | None, batches_per_step: float, line: SourceLine | None,
                    bandwidth: Bandwidth | None, no_gpu: str) -> list[Finding]:
    """The batch's bytes against its smallest lossless dtypes, when they are fewer."""
    if anatomy is None or anatomy.bytes_if_smaller >= anatomy.bytes_per_batch:
        return []
    saved = (anatomy.bytes_per_batch - anatomy.bytes_if_smaller) * batches_per_step
    changes = ", ".join(f"{t.path} {t.dtype} -> {t.smaller_dtype}" for t in anatomy.tensors
                        if t.bytes_if_smaller < t.bytes)
    if bandwidth is None:
        ms, cost = None, f"not measured: {no_gpu}"
    else:
        ms = saved / bandwidth.rate(HOST_TO_DEVICE, False) * 1e3
        cost = "estimated: the bytes saved over the pageable host-to-device bandwidth measured on the device"
    return [Finding(
        kind="memory",
        title=f"the batch ships {human_bytes(anatomy.bytes_per_batch)}; {human_bytes(anatomy.bytes_if_smaller)} in its "
              "smallest lossless dtypes",
        path=line.path if line else None, line=line.lineno if line else None, code=line.code if line else "",
        per_step=batches_per_step, ms_per_step=ms, cost=cost,
        fix=f"ship smaller dtypes ({changes}) and convert on the device",
    )]


def _order(finding: Finding) -> tuple[int, float, str, int]:
    if finding.ms_per_step is not None:
        return 0, -finding.ms_per_step, finding.path or "", finding.line or 0
    per_step = finding.per_step if finding.per_step is not None else -1.0
    return 1, -per_step, finding.path or "", finding.line or 0


def rank(findings: Iterable[Finding], step_ms: float | None) -> tuple[Finding, ...]:
    """Order findings by cost and number them, each with its share of the step.

    Args:
        findings: the findings, in any order.
        step_ms: the mean step time (None when no step was timed: no share is given); the mean, so that the
            loader's share is its wait share, the wait over the time of the timed steps.

    Returns:
        The findings, ranked from 1.
    """
    return tuple(
        dataclasses.replace(
            finding, rank=position,
            share_of_step=finding.ms_per_step / step_ms if finding.ms_per_step is not None and step_ms else None,
        )
        for position, finding in enumerate(sorted(findings, key=_order), start=1)
    )

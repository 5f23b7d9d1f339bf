"""`pitfalls doctor`'s report as text: the ranked findings, then each phase's figures and what was not measured."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from pitfalls.doctor.baseline import Comparison
from pitfalls.doctor.report import CudaOnCpuFigures, DoctorReport, Finding
from pitfalls.doctor.try_settings import Tried
from pitfalls.units import human_bytes

__all__ = ["render", "render_gate", "render_tried"]


def _where(path: str | None, line: int | None, bases: tuple[Path, ...]) -> str:
    """``path:line``, the path relative to the first of ``bases`` that holds it."""
    if path is None:
        return "-"
    resolved = Path(path).resolve()
    shown = next((str(resolved.relative_to(base)) for base in bases if resolved.is_relative_to(base)), path)
    return f"{shown}:{line}" if line is not None else shown


def _cost(finding: Finding) -> str:
    if finding.ms_per_step is None:
        return finding.cost
    share = f" ({finding.share_of_step:.0%})" if finding.share_of_step is not None else ""
    return f"{finding.ms_per_step:.3g} ms{share}"


def _steps(report: DoctorReport) -> str:
    s = report.steps
    by = {"optimizer": "the first optimizer's steps", "loader": "DataLoader batches (no torch.optim optimizer "
          "stepped)"}.get(s.counted_by or "", "nothing: no step began")
    gpu = f", {s.gpu} under the sync debug mode" if s.gpu else ""
    memory = f", {s.memory} for memory" if s.memory else ""
    return (f"{s.total} steps ({s.warmup} warm-up, {s.measured} timed, {s.before_scan} before the scan, "
            f"{s.scanned} scanned{memory}{gpu}), counted by {by}; {report.ended}")


def _cuda_on_cpu(mapped: CudaOnCpuFigures) -> str:
    calls = ", ".join(f"{count} {kind}" for kind, count in mapped.calls) or "no CUDA call"
    major, minor = mapped.capability
    return (f"CUDA mapped onto the CPU (--cuda-on-cpu): {calls}; the device answers as {mapped.device} (compute "
            f"capability {major}.{minor}), {mapped.devices} device(s); the timings are the CPU's")


def _findings(report: DoctorReport, console: Console, bases: tuple[Path, ...]) -> None:
    if not report.findings:
        console.print(Text("no finding: nothing in the measured steps costs the step what the doctor can see"
                           if report.steps.scanned else "no finding, but the scanned steps never ran: see what was "
                           "not measured"))
        return
    table = Table(title=Text("findings, the costliest first (measured costs, then the rest by count per step)"))
    for column, options in (("#", {"justify": "right"}), ("kind", {}), ("where", {"no_wrap": True}),
                            ("what", {"ratio": 2}), ("per step", {"justify": "right"}),
                            ("cost per step", {"ratio": 1}), ("fix", {"ratio": 3})):
        table.add_column(column, **options)
    for f in report.findings:
        per_step = "-" if f.per_step is None else f"{f.per_step:g}"
        what = f.title + (f"\n{f.code}" if f.code else "")
        table.add_row(*(Text(cell) for cell in (str(f.rank), f.kind, _where(f.path, f.line, bases), what, per_step,
                                                _cost(f), f.fix)))
        for path, line in f.call_sites:
            table.add_row(Text(""), Text(""), Text(f"  <- {_where(path, line, bases)}", style="dim"),
                          Text("called from the step here", style="dim"), Text(""), Text(""), Text(""))
    console.print(table)


def _details(report: DoctorReport, console: Console, bases: tuple[Path, ...]) -> None:
    loader = report.loader
    if loader is not None:
        batch = f", {human_bytes(loader.batch_bytes)} a batch" if loader.batch_bytes is not None else ""
        console.print(Text(f"loader: {loader.verdict}, waits {loader.ms_per_step:.3g} ms a step in next() "
                           f"({loader.wait_share:.0%} of the step), {loader.batches_per_step:g} batch(es) a step, "
                           f"{loader.workers} workers{batch}"))
    c = report.compile
    breaks = "; ".join(f"{b.reason} at {_where(b.path, b.line, bases)}" for b in c.graph_breaks) or "none"
    recompiles = "; ".join(
        f"{r.function}: {r.reason}" + (" (during the timed steps)" if r.during_timed_steps else "")
        for r in c.recompiles) or "none"
    seconds = "n/a" if c.compile_s is None else f"{c.compile_s:.2f} s"
    console.print(Text(f"torch.compile: {len(c.graph_breaks)} graph break(s): {breaks}; {len(c.recompiles)} "
                       f"recompile(s): {recompiles}; compiling took {seconds}"
                       + (f" (unavailable: {c.unavailable})" if c.unavailable else "")))
    m = report.memory
    if m is not None:
        peak = "n/a" if m.peak_bytes is None else human_bytes(m.peak_bytes)
        console.print(Text(f"memory ({m.source}): peak {peak}; {m.detail}"))
    for row in report.copies:
        kind = f"{'pinned' if row.pinned else 'pageable'}, {'blocking' if row.blocking else 'non-blocking'}"
        console.print(Text(f"copy at {_where(row.path, row.line, bases)}: {row.call} {row.direction}, {kind}, "
                           f"{row.per_step:g} a step, {human_bytes(row.bytes_per_step)} a step"))
    if report.real_syncs is not None:
        agree = "agree with" if report.syncs_agree else "DIFFER from"
        console.print(Text(f"real CUDA syncs by line {agree} the hazard counts:"))
        for r in report.real_syncs:
            console.print(Text(f"  {_where(r.path, r.line, bases)}: {r.real_per_step:g} real, {r.hazards_per_step:g} "
                               f"hazards a step; stall {r.stall_ms_per_step:.3g} ms a step"))
    if report.bandwidth:
        console.print(Text("copy bandwidth on the device: " + ", ".join(f"{k} {v:.1f} GB/s"
                                                                         for k, v in report.bandwidth)))
    once = ", ".join(f"{o.what} {'n/a' if o.seconds is None else f'{o.seconds:.2f} s'}" for o in report.one_off)
    console.print(Text(f"one-off costs (not per step): {once}"))


def render(report: DoctorReport, console: Console) -> None:
    """Print a report: the steps, the ranked findings, the phases' figures, what explains the step."""
    script = _where(report.script, None, (Path.cwd().resolve(),))
    rank = "" if report.rank is None else f" (rank {report.rank}; every rank's figures after its report)"
    console.print(Text(f"pitfalls doctor {script} {' '.join(report.argv)}".rstrip() + rank))
    console.print(Text(_steps(report)))
    if report.cuda_on_cpu is not None:
        console.print(Text(_cuda_on_cpu(report.cuda_on_cpu)))
    if report.failure is not None:
        where = f"in step {report.failure.step}" if report.failure.step else "before its first step"
        console.print(Text(f"the script failed {where}: {report.failure.last_line}", style="red"))
        if report.failure.hint:
            console.print(Text(f"hint: {report.failure.hint}"))
    # Lines are shown from the script's folder (or the working one) when they lie inside it.
    bases = (Path(report.script).resolve().parent, Path.cwd().resolve())
    _findings(report, console, bases)
    _details(report, console, bases)
    for line in report.not_measured:
        console.print(Text(f"not measured: {line}"))
    if report.step_ms is None:
        console.print(Text("step time: not measured (no step was timed)"))
    else:
        median, p90, mean = report.step_ms
        explained = "" if report.explained is None else (
            f"; the findings with a measured cost explain {report.explained:.0%} of the mean")
        console.print(Text(f"step time over {report.steps.measured} timed steps: {median:.3g} ms median, {p90:.3g} "
                           f"ms p90, {mean:.3g} ms mean{explained}"))
    console.print(Text(f"doctor's run: {report.wall_s:.1f} s"))


def render_gate(gate: Comparison, console: Console) -> None:
    """Print a run against its baseline: what is new or grew (the gate fails), then what was removed or fell."""
    verdict = "fails" if gate.failed else "passes"
    console.print(Text(f"baseline {gate.file}: the gate {verdict}", style="red" if gate.failed else "green"))
    for heading, changes in (("new", gate.added), ("grew", gate.grew), ("removed", gate.removed),
                             ("fewer", gate.shrank)):
        for change in changes:
            console.print(Text(f"  {heading}: {change.sentence()}"))
    if not (gate.added or gate.grew or gate.removed or gate.shrank):
        console.print(Text("  nothing added, nothing removed"))


def _cell(value: float | None, form: str) -> str:
    return "-" if value is None else format(value, form)


def render_tried(tried: Tried, console: Console) -> None:
    """Print the settings tried: one row each, the fix ranked; or why none was tried."""
    if not tried.rows:
        console.print(Text(f"--try: not run: {tried.note}"))
        return
    warmup, steps = tried.steps
    table = Table(title=Text(f"the DataLoader's settings, each run in a fresh process ({warmup} warm-up and {steps} "
                             "timed steps each)"))
    for column in ("setting", "workers", "step ms (median)", "step ms (mean)", "wait share", "speedup",
                   "same batches", ""):
        table.add_column(column)
    for row in tried.rows:
        same = {True: "yes", False: "no: changes the batches", None: "not judged"}[row.same_batches]
        table.add_row(row.setting, "-" if row.workers is None else str(row.workers), _cell(row.step_ms, ".3g"),
                      _cell(row.mean_ms, ".3g"), _cell(row.wait_share, ".0%"),
                      "-" if row.speedup is None else f"{row.speedup:.2f}x", same,
                      "the fix, measured" if row.fix else row.note)
    console.print(table)
    if tried.note:
        console.print(Text(f"--try: {tried.note}"))
    best = tried.best
    if best is not None and best.speedup is not None:
        console.print(Text(f"the fix, measured: {best.setting}: {best.speedup:.2f}x the script's own steps per "
                           "second, the same batches"))

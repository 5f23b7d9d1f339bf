"""`pitfalls scan-loader`'s report as tables."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from pitfalls.result import Unavailable
from pitfalls.scan_loader.results import ScanLoaderReport, WorkerGrowth
from pitfalls.units import human_bytes

__all__ = ["render"]


def _seconds(value: float | Unavailable | None) -> str:
    if isinstance(value, Unavailable) or value is None:
        return f"n/a: {value.reason}" if isinstance(value, Unavailable) else "n/a"
    return f"{value:.3f} s"


def render(report: ScanLoaderReport, console: Console) -> None:
    """Print the anatomy, throughput, memory and advice tables."""
    shape = report.anatomy
    table = Table(title=Text(f"anatomy of a batch of {report.target}: {shape.samples_per_batch} samples, "
                             f"{shape.bytes_per_batch:,} bytes (smaller dtypes judged on {shape.batches_seen} "
                             "batches)"))
    for column in ("tensor", "shape", "dtype", "bytes", "smallest lossless", "bytes then", "how"):
        table.add_column(column, overflow="fold")
    for t in shape.tensors:
        table.add_row(*(Text(cell) for cell in (t.path, "x".join(map(str, t.shape)), t.dtype, f"{t.bytes:,}",
                                                t.smaller_dtype, f"{t.bytes_if_smaller:,}", t.how)))
    table.add_row("total", "", "", f"{shape.bytes_per_batch:,}", "", f"{shape.bytes_if_smaller:,}",
                  f"{shape.bytes_per_batch / max(shape.bytes_if_smaller, 1):.2f}x fewer bytes")
    console.print(table)

    ceiling = report.ceiling_samples_per_second
    title = (f"throughput on {report.device} at steady state"
             f" (step: {report.step or 'none, zero cost'}); ceiling, the same batches from RAM: "
             + (f"{ceiling:,.1f} samples/s" if not isinstance(ceiling, Unavailable) else f"n/a: {ceiling.reason}"))
    table = Table(title=Text(title))
    for column in ("setting", "samples/s", "wait in next()", "verdict", "batches timed (discarded)",
                   "in flight (W x prefetch x batch)", "peak PSS", "peak USS"):
        table.add_column(column, overflow="fold")
    for r in report.settings:
        flight = human_bytes(shape.in_flight_bytes(r.setting.workers, report.prefetch_factor))
        memory = ("n/a", "n/a") if isinstance(r.peak, Unavailable) else \
            (human_bytes(r.peak.peak_pss), human_bytes(r.peak.peak_uss))
        if r.steady is None or r.bound is None:
            table.add_row(r.setting.label, f"skipped: {r.skipped}", "", "", "", flight, *memory)
            continue
        timed = f"{r.steady.batches} ({r.steady.discarded})" + (f"; short: {r.steady.short}" if r.steady.short else "")
        table.add_row(r.setting.label, f"{r.steady.samples_per_second:,.1f}", f"{r.steady.wait_share:.0%}",
                      f"{r.bound.verdict}: {r.bound.margin}", timed, flight, *memory)
    console.print(table)
    if report.device.startswith("cpu"):
        console.print("pin_memory: n/a on cpu (pinning speeds up host-to-GPU copies only; run with --device cuda)")
    starts = ", ".join(f"{k}: {_seconds(v)}" for k, v in report.epoch_start.items())
    console.print(Text(f"time to the first batch of an epoch: {starts}"))
    cow = report.copy_on_write
    if isinstance(cow, WorkerGrowth):
        console.print(Text(f"copy-on-write over {cow.items_read:,} items read at num_workers={cow.workers}: "
                           f"{cow.per_item:,.0f} bytes per item; per worker "
                           + ", ".join(human_bytes(g) for g in cow.growth)))
    else:
        console.print(Text(f"copy-on-write: n/a: {cow.reason}"))
    for c in report.containers:
        touched = report.touch_copied.get(c.name)
        copied = f"; reading each one in a forked process copies {human_bytes(touched)}" if touched is not None else ""
        console.print(Text(f"  {c.name}: a {c.kind} of {c.length:,} Python objects, about {human_bytes(c.bytes)}"
                           f"{copied}"))

    table = Table(title="advice, measured gains first, then the arithmetic")
    for column in ("#", "change", "gain", "figure", "why"):
        table.add_column(column, overflow="fold")
    for index, finding in enumerate(report.advice, 1):
        basis = "measured" if finding.measured else "arithmetic"
        gain = f"{finding.gain:.2f}x {finding.unit} ({basis})" if finding.unit else basis
        table.add_row(str(index), Text(finding.change), gain, Text(finding.figure), Text(finding.why))
    console.print(table)
    console.print(f"scanned in {report.elapsed_s:.1f} s of a {report.budget_s:g} s budget")

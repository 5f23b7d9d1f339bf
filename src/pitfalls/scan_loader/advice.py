"""Advice, ranked: what was measured (workers, pinning, persistent workers) by its measured gain first, then what
follows from the arithmetic (smaller dtypes, the dataset's Python objects, the dataset in RAM) by its factor."""

from __future__ import annotations

import dataclasses

import psutil

from pitfalls.scan_loader.results import Advice, ScanLoaderReport, SettingResult, WorkerGrowth
from pitfalls.units import human_bytes

__all__ = ["advise"]

# Copy-on-write below this over an epoch (all workers) is not worth a change of data structure.
MIN_COPIED = 4 * 2**20
# Below this measured gain a change is within the noise of a shared machine and is not advised.
MIN_GAIN = 1.05


def _rate(result: SettingResult) -> float:
    return result.steady.samples_per_second if result.steady is not None else 0.0


def _measured(report: ScanLoaderReport) -> list[Advice]:
    found = []
    plain = {r.setting.workers: r for r in report.settings if not r.setting.pin_memory and r.steady is not None}
    if 0 in plain and len(plain) > 1:
        best = max(plain.values(), key=_rate)
        gain = _rate(best) / _rate(plain[0])
        if best.setting.workers and gain >= MIN_GAIN:
            found.append(Advice(f"num_workers={best.setting.workers}", gain, True,
                                 f"{_rate(best):.1f} samples/s against {_rate(plain[0]):.1f} at num_workers=0",
                                 "workers load the next batches while the step runs", "samples/s"))
    pinned = {r.setting.workers: r for r in report.settings if r.setting.pin_memory and r.steady is not None}
    for workers, result in sorted(pinned.items()):
        if workers in plain and _rate(result) / _rate(plain[workers]) >= MIN_GAIN:
            found.append(Advice(f"pin_memory=True (num_workers={workers})", _rate(result) / _rate(plain[workers]),
                                 True, f"{_rate(result):.1f} samples/s against {_rate(plain[workers]):.1f} unpinned",
                                 "a pinned batch is copied to the GPU by DMA, without a staging copy", "samples/s"))
    off, on = report.epoch_start.get("persistent_workers=off"), report.epoch_start.get("persistent_workers=on")
    if isinstance(off, float) and isinstance(on, float) and report.batches_per_epoch and plain:
        epoch_s = report.batches_per_epoch * report.anatomy.samples_per_batch / max(_rate(r) for r in plain.values())
        gain = (epoch_s + off) / (epoch_s + on)
        if off > on and gain >= 1.0 + (MIN_GAIN - 1.0) / 5:
            found.append(Advice("persistent_workers=True", gain, True,
                                 f"first batch of an epoch in {on:.2f} s instead of {off:.2f} s "
                                 f"(an epoch takes about {epoch_s:.1f} s)",
                                 "the workers survive the epoch's end instead of being started again",
                                 "epoch time"))
    return sorted(found, key=lambda f: f.gain, reverse=True)


def _arithmetic(report: ScanLoaderReport) -> list[Advice]:
    found = []
    shape = report.anatomy
    if shape.bytes_if_smaller < shape.bytes_per_batch:
        changes = ", ".join(f"{t.path} {t.dtype} -> {t.smaller_dtype}" for t in shape.tensors
                            if t.bytes_if_smaller < t.bytes)
        workers = max((r.setting.workers for r in report.settings), default=0)
        now = shape.in_flight_bytes(workers, report.prefetch_factor)
        then = workers * report.prefetch_factor * shape.bytes_if_smaller
        flight = f"; in flight at num_workers={workers}: {human_bytes(now)} -> {human_bytes(then)}" if workers else ""
        found.append(Advice(f"ship smaller dtypes ({changes})", shape.bytes_per_batch / shape.bytes_if_smaller,
                             False, f"{shape.bytes_per_batch:,} -> {shape.bytes_if_smaller:,} bytes per batch{flight}",
                             "fewer bytes to collate, to pass between processes and to copy to the device; convert "
                             "and normalize on the device", "fewer bytes"))
    cow = report.copy_on_write
    epoch_bytes = cow.per_item * report.items if isinstance(cow, WorkerGrowth) and report.items else 0.0
    if isinstance(cow, WorkerGrowth) and epoch_bytes >= MIN_COPIED and report.containers:
        largest = max(report.containers, key=lambda c: report.touch_copied.get(c.name, c.bytes))
        found.append(Advice(f"hold {largest.name} as arrays (numpy, Arrow), not {largest.length:,} Python objects",
                             1.0, False,
                             f"the workers copy {cow.per_item:,.0f} bytes per item read: {human_bytes(epoch_bytes)} "
                             "over an epoch",
                             "reading a Python object writes its reference count, so each worker copies its page "
                             "(PyTorch issue 13246)"))
    if report.items:
        per_item = shape.bytes_if_smaller // max(shape.samples_per_batch, 1)
        ram = report.items * per_item
        available = psutil.virtual_memory().available
        fits = ram < available // 2
        found.append(Advice("hold the decoded items in RAM" if fits else "keep the items on disk (they do not fit)",
                             1.0, False, f"{report.items:,} items x {per_item:,} "
                             f"bytes = {human_bytes(ram)}; {human_bytes(available)} available",
                             "items already decoded, resized and in their smallest dtype cost no file reads or "
                             "decoding per epoch" if fits else "the decoded items would take over half the free RAM"))
    return sorted(found, key=lambda f: f.gain, reverse=True)


def advise(report: ScanLoaderReport) -> ScanLoaderReport:
    """The report with its advice: measured changes by measured gain, then the arithmetic by its factor."""
    return dataclasses.replace(report, advice=tuple(_measured(report) + _arithmetic(report)))



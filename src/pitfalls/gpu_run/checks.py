"""The GPU proof's checks of the cases on the device: the gate, NVML while each case loops, CUDA events against host
time, interleaved speedups at the articles' sizes, the loader's step cost, the calibration table's CUDA rows and the
parallel family's largest global batch. Each is one piece of the budgeted run (`pitfalls.gpu_run.pieces`); off a
GPU each runs at the rehearsal's sizes and every GPU-only figure reads "unavailable: <reason>".
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import torch

from pitfalls import measure
from pitfalls.devices import synchronize
from pitfalls.equivalence import check_all
from pitfalls.families.parallel import memory
from pitfalls.family import NVML, SPEEDUP, Case, Family, SkipCase
from pitfalls.gpu_run.outcome import piece_rows, value
from pitfalls.gpu_run.sizes import Sizes
from pitfalls.probes import NvmlSummary, Unavailable, cuda_event_time, wall_time
from pitfalls.registry import all_families, family

__all__ = ["LARGEST_BATCH_S", "build_or_skip", "calibration_cuda_rows", "event_against_host_time", "gate",
           "largest_batches", "largest_global_batch", "loader_step_cost", "nvml_while_looping", "speedups"]

# Seconds the parallel family's largest-batch search may take in all, before its last try.
LARGEST_BATCH_S = 120.0


def build_or_skip(entry: Family, variant: str, device: str, params: Mapping[str, Any],
                  rows: list[dict[str, Any]]) -> Case | None:
    """Build a case, or record in ``rows`` why it cannot run here (e.g. it needs more devices) and return None."""
    try:
        return entry.build(variant, device=device, **params)
    except SkipCase as skip:
        rows.append({"family": entry.name, "variant": variant, "sizes": dict(params), "skipped": skip.reason})
        return None


def gate(device: str, _sizes: Sizes) -> list[dict[str, Any]]:
    """``pitfalls check`` on the device: every variant against naive; a row whose own path did not run is n/a."""
    rows = piece_rows()
    for row in check_all((device,)):
        verdict = "n/a" if row.skipped else ("yes" if row.matches else "NO")
        rows.append({"family": row.family, "variant": row.variant, "matches_naive": verdict,
                     "max_abs_diff": None if row.skipped else row.max_abs_diff,
                     "ran": f"stand-in: {row.stand_in}" if row.stand_in else ("-" if row.skipped else "its own"),
                     "detail": f"not run here: {row.skipped}" if row.skipped else row.detail})
    return rows


def nvml_while_looping(device: str, sizes: Sizes) -> list[dict[str, Any]]:
    """NVML's utilization, memory, power and clock while each case loops for a few seconds, at the first of
    each family's sizes."""
    rows = piece_rows()
    for entry in all_families().values():
        if NVML not in entry.figures:
            continue
        params = sizes.of(entry.name)[0]
        for variant in entry.cases:
            case = build_or_skip(entry, variant, device, params, rows)
            if case is None:
                continue
            calls = 0

            def counted(case: Case = case) -> None:
                nonlocal calls
                case()
                calls += 1

            with case:
                case()  # warm-up, outside the sampled window
                synchronize(case.device)
                summary = measure.nvml_window(counted, case.device, sizes.nvml_seconds)
            row: dict[str, Any] = {"family": entry.name, "variant": variant, "sizes": params, "calls": calls}
            if isinstance(summary, NvmlSummary):
                for name in ("utilization_pct", "nvml_utilization_pct", "memory_used_mib", "power_w",
                             "sm_clock_mhz"):
                    metric = getattr(summary, name)
                    row[name] = value(metric) if isinstance(metric, Unavailable) else round(metric.mean, 1)
                row["samples"] = getattr(summary.utilization_pct, "samples", 0)
            else:
                row["nvml"] = value(summary)
            rows.append(row)
    return rows


def event_against_host_time(device: str, sizes: Sizes) -> list[dict[str, Any]]:
    """CUDA-event time and host wall time of the same calls, for each family's naive variant and its floor:
    they agree when the host timer synchronizes."""
    rows = piece_rows()
    for entry in all_families().values():
        for variant in (entry.baseline, entry.cases[-1]):
            case = build_or_skip(entry, variant, device, entry.smoke, rows)
            if case is None:
                continue

            def call(case: Case = case) -> None:
                case()
                synchronize(case.device)

            with case:
                host = wall_time(call, warmup=2, min_run_time=sizes.host_seconds).median_s * 1e3
                events = cuda_event_time(case, calls=20, warmup=2)
            event_ms: float | Unavailable = events if isinstance(events, Unavailable) else events.median_ms
            ratio: float | Unavailable = (event_ms if isinstance(event_ms, Unavailable) else host / event_ms
                                          if event_ms > 0 else Unavailable("the events timed no device work"))
            rows.append({"family": entry.name, "variant": variant, "host_ms": round(host, 3),
                         "cuda_event_ms": value(event_ms), "host_over_events": value(ratio)})
    return rows


def speedups(device: str, sizes: Sizes) -> list[dict[str, Any]]:
    """Interleaved speedups over naive of every variant and floor, at each of the family's sizes."""
    rows = piece_rows()
    for entry in all_families().values():
        if SPEEDUP not in entry.figures:
            continue
        for params in sizes.of(entry.name):
            naive = build_or_skip(entry, entry.baseline, device, params, rows)
            if naive is None:
                continue
            with naive:
                for variant in entry.cases[1:]:
                    candidate = build_or_skip(entry, variant, device, params, rows)
                    if candidate is None:
                        continue
                    with candidate:
                        result = measure.speedup(naive, candidate, rounds=sizes.rounds, blocks=sizes.rounds, calls=5,
                                                 seconds=sizes.speedup_seconds)
                    rows.append({"family": entry.name, "variant": variant, "sizes": params,
                                 "speedup": round(result.ratio, 2),
                                 "naive_ms": round(result.baseline_median_s * 1e3, 3),
                                 "variant_ms": round(result.candidate_median_s * 1e3, 3)})
    return rows


def loader_step_cost(device: str, _sizes: Sizes) -> list[dict[str, Any]]:
    """The loader's model_ms step (a matmul loop sized by timing its products on a GPU, a clock spin on a CPU):
    planted against measured milliseconds per call, synchronized; then the verdict of two rungs with it."""
    from pitfalls.families.loader import stepcost, verdict

    rows = piece_rows()
    for model_ms in (2, 10, 50):
        planted, measured = stepcost.planted_against_measured(model_ms, torch.device(device))
        rows.append({"model_ms": planted, "measured_ms": round(measured, 3), "ratio": round(measured / planted, 3)})
    for variant in ("naive", "uint8"):
        try:
            said = verdict.verdict(variant, device, **{**family("loader").smoke, "model_ms": 10}).describe()
        except SkipCase as skip:
            said = f"n/a: {skip.reason}"
        rows.append({"model_ms": 10, "variant": variant, "verdict": said})
    return rows


def calibration_cuda_rows(device: str, _sizes: Sizes) -> list[dict[str, Any]]:
    """The calibration table's CUDA rows (`pitfalls calibrate`; each reads n/a with its reason off a GPU; the CPU
    rows are the test command's every run)."""
    from pitfalls.calibration.run import all_checks, run_checks
    from pitfalls.known.table import CUDA

    columns = ("check", "unit", "planted", "measured", "error", "tolerance", "verdict", "reason")
    rows = piece_rows()
    for check in all_checks():
        if check.device == CUDA:
            [row] = run_checks([check], device)
            rows.append({c: getattr(row, c) for c in columns})
    return rows


def largest_global_batch(variant: str, params: Mapping[str, Any], deadline: float | None = None) -> Any:
    """The largest global batch of a variant that ran on the GPUs (a bounded search, measured: out of memory is
    "does not fit"); ">= N" when the search's bound still fit or its time limit (a ``time.monotonic()``
    ``deadline``) came first, n/a with the reason when it could not search."""
    world = int(params["world_size"])
    try:
        per_rank = memory.largest_fitting(memory.fits_on_gpu(variant, world, int(params["image_size"])),
                                          deadline=deadline)
    except SkipCase as skip:
        return value(Unavailable(skip.reason))
    if isinstance(per_rank, Unavailable):
        return value(per_rank)
    if isinstance(per_rank, memory.Stopped):
        below = f", < {per_rank.high * world}" if per_rank.high is not None else ""
        return f">= {per_rank.low * world}{below} (the search's time limit stopped it)"
    if per_rank == memory.BATCH_LIMIT:
        return f">= {per_rank * world} (the search stops at {memory.BATCH_LIMIT} images per rank)"
    return per_rank * world


def largest_batches(device: str, sizes: Sizes) -> list[dict[str, Any]]:
    """The parallel family's largest global batch per variant at its first size on the GPUs there are, the search
    bounded in time (`LARGEST_BATCH_S`)."""
    if device != "cuda":
        return [{"family": "parallel", "largest_global_batch": "unavailable: no CUDA device (the search runs real "
                                                               "steps on the GPUs)"}]
    rows = piece_rows()
    params = sizes.of("parallel")[0]
    params["world_size"] = max(1, min(int(params["world_size"]), torch.cuda.device_count()))
    deadline = time.monotonic() + LARGEST_BATCH_S
    for variant in family("parallel").variants:
        rows.append({"family": "parallel", "variant": variant, "sizes": params,
                     "largest_global_batch": largest_global_batch(variant, params, deadline)})
    return rows

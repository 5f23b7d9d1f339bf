"""The articles' headline measurements at the articles' sizes (`pitfalls.gpu_run.sizes`), with the suite's own cases
and routines; each row carries what the claims table (`pitfalls.report.claims`) reads.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from pitfalls import measure
from pitfalls.devices import synchronize
from pitfalls.family import Case, SkipCase
from pitfalls.gpu_run.outcome import piece_rows, value
from pitfalls.gpu_run.sizes import Sizes
from pitfalls.probes import NvmlSummary, Unavailable
from pitfalls.registry import family

__all__ = ["loader", "loss", "parallel", "sampler"]


WARMUP_EAGER, WARMUP_COMPILED = 2, 4


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 4)


@contextlib.contextmanager
def _built(name: str, variant: str, device: str, compiled: bool, sizes: Mapping[str, Any],
           rows: list[dict[str, Any]]) -> Iterator[Case | None]:
    """A case built and warmed up (compiled on its first call), or None with a row saying why it cannot run here."""
    try:
        case = family(name).build(variant, device=device, compiled=compiled, **sizes)
    except SkipCase as skip:
        rows.append({"family": name, "variant": variant, "compiled": compiled, "sizes": dict(sizes),
                     "skipped": skip.reason})
        yield None
        return
    with case:
        # The first call compiles or fills the allocator's caches; a compiled case's next calls still settle (on a
        # CPU the 2nd and 3rd call of the compiled sampler took 130 and 27 ms, the 4th 0.4 ms).
        for _ in range(WARMUP_COMPILED if compiled else WARMUP_EAGER):
            case()
        synchronize(case.device)
        yield case


def _syncs(case: Case) -> dict[str, Any]:
    """Sync hazards of one eager call and real CUDA syncs per call (n/a off CUDA), as asv publishes them."""
    return {"sync_hazards": measure.sync_hazards(case), "cuda_syncs": value(measure.cuda_syncs(case))}


def _busy(case: Case, seconds: float) -> Any:
    """NVML's mean GPU busy percent while the case loops (n/a with the reason off a GPU)."""
    summary = measure.nvml_window(case, case.device, seconds)
    if not isinstance(summary, NvmlSummary):
        return value(summary)
    metric = summary.utilization_pct
    return value(metric) if isinstance(metric, Unavailable) else round(metric.mean, 1)


def _against(name: str, device: str, sizes: Sizes, params: Mapping[str, Any], candidates: Sequence[str],
             rows: list[dict[str, Any]], *, compiled: bool = False,
             extra: Callable[[Case, Case], dict[str, Any]] | None = None) -> None:
    """Each candidate against the family's naive variant run eagerly, at ``params``, by the one speedup routine, a
    row each appended to ``rows``."""
    entry = family(name)
    with _built(name, entry.baseline, device, False, params, rows) as naive:
        if naive is None:
            return
        naive_figures = _syncs(naive)
        for variant in candidates:
            with _built(name, variant, device, compiled, params, rows) as candidate:
                if candidate is None:
                    continue
                result = measure.speedup(naive, candidate, rounds=sizes.rounds)
                row = {"family": name, "variant": variant, "compiled": compiled, "sizes": dict(params),
                       "naive_ms": _ms(result.baseline_median_s), "variant_ms": _ms(result.candidate_median_s),
                       "speedup": round(result.ratio, 3), "naive_sync_hazards": naive_figures["sync_hazards"],
                       "naive_cuda_syncs": naive_figures["cuda_syncs"]}
                if not compiled:
                    row.update({f"variant_{key}": figure for key, figure in _syncs(candidate).items()})
                if extra is not None:
                    row.update(extra(naive, candidate))
                rows.append(row)


def loss(device: str, sizes: Sizes) -> list[dict[str, Any]]:
    """Article 000: every loss variant and the floor against naive, one training step each (ms, ratio, syncs, and
    NVML busy of both sides: a step that keeps the GPU busy has little to gain from removing its syncs)."""
    entry = family("loss")

    def busy(naive: Case, candidate: Case) -> dict[str, Any]:
        return {"naive_busy_pct": _busy(naive, sizes.busy_seconds),
                "variant_busy_pct": _busy(candidate, sizes.busy_seconds)}

    rows = piece_rows()
    for params in sizes.of("loss"):
        _against("loss", device, sizes, params, entry.cases[1:], rows, extra=busy)
    return rows


def sampler(device: str, sizes: Sizes, *, batched: bool, compiled: bool) -> list[dict[str, Any]]:
    """Article 004: the static sampler (eager, or torch.compile'd) against eager nonzero (which cannot compile whole)
    at each of the sampler's sizes of one form: one row of N items per call, or a batch of rows (nonzero loops over
    them in Python, static takes them in one call)."""
    rows = piece_rows()
    for params in sizes.of("sampler"):
        if (params.get("batch", 1) > 1) == batched:
            _against("sampler", device, sizes, params, ("static",), rows, compiled=compiled)
    return rows


def loader(device: str, sizes: Sizes) -> list[dict[str, Any]]:
    """Article 001: naive against uint8 at the article's batch: bytes per batch, samples/s (steady state), NVML
    busy while batches are delivered, and the batches and bytes the workers hold in flight at rest."""
    from pitfalls.families.loader import probes

    rows = piece_rows()
    for params in sizes.of("loader"):
        for variant in ("naive", "uint8"):
            row: dict[str, Any] = {"family": "loader", "variant": variant, "sizes": params}
            try:
                row["bytes_per_batch"] = probes.bytes_per_batch(variant, device, **params)
                flight = probes.in_flight(variant, device, **params)
                row["batches_in_flight"] = flight.batches
                row["bytes_in_flight"] = value(flight.measured_bytes)
                with family("loader").build(variant, device=device, **params) as case:
                    row["samples_per_s"] = round(probes.samples_per_second(probes.batch_step(case)), 2)
                    row["busy_pct"] = _busy(case, sizes.busy_seconds)
            except SkipCase as skip:
                row["skipped"] = skip.reason
            rows.append(row)
    return rows


def parallel(device: str, sizes: Sizes) -> list[dict[str, Any]]:
    """Article 001: DataParallel against DDP: step time, samples/s, device 0's memory (estimated before anything
    runs, and measured) and the memory imbalance."""
    from pitfalls.families.parallel import measure_figures
    from pitfalls.families.parallel.entry import device_estimates

    rows = piece_rows()
    for params in sizes.of("parallel"):
        for variant in family("parallel").variants:
            row: dict[str, Any] = {"family": "parallel", "variant": variant, "sizes": params,
                                   "device0_estimated_bytes": device_estimates(variant, params)[0]}
            try:
                with family("parallel").build(variant, device=device, **params) as case:
                    figures = measure_figures(case, steps=3, nvml_seconds=sizes.busy_seconds)
            except SkipCase as skip:
                row["skipped"] = skip.reason
            else:
                row.update({"step_ms": value(figures.step_s if isinstance(figures.step_s, Unavailable)
                                             else _ms(figures.step_s)),
                            "samples_per_s": value(figures.samples_per_s),
                            "device0_bytes": value(figures.rank0_memory()),
                            "memory_imbalance": value(figures.memory_imbalance())})
            rows.append(row)
    return rows

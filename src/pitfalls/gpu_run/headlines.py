"""The articles' headline measurements at the articles' sizes (on a CPU, at small sizes that finish in seconds).

Each is measured with the suite's own cases and routines: the one speedup routine (`case_speedup`), the hazard and
CUDA sync counters, the NVML window, and the loader and parallel families' own probes. Each row carries what the
claims table (`pitfalls.report.claims`) reads: the milliseconds, the ratio and the figures that explain it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pitfalls import measure
from pitfalls.devices import synchronize
from pitfalls.family import Case, SkipCase
from pitfalls.gpu_proof import section_rows
from pitfalls.probes import NvmlSummary, Unavailable
from pitfalls.registry import family

__all__ = ["ARTICLE", "SMALL", "HeadlineSizes", "loader", "loss", "parallel", "sampler_batched", "sampler_compiled",
           "sampler_eager"]


@dataclass(frozen=True)
class HeadlineSizes:
    """The sizes and effort of the headline measurements on one kind of device.

    Attributes:
        article: whether these are the articles' sizes (the claims table gives a verdict only then).
        loss: the loss step's sizes (article 000: batch 256 at 256x256).
        sampler_n: N of the sampler's eager and batched rows (article 004: 1e3..1e7).
        sampler_compiled_n: N of its compiled rows (the article's 70-75 % is at 1e4..1e5).
        loader: the loader's sizes (article 001: batches of 32 at 512x512, 8 workers).
        parallel: the parallel family's sizes (article 001: 4 GPUs, 8 images each, 512x512).
        rounds: interleaved rounds of each speedup.
        nvml_seconds: seconds a case loops while NVML samples.
    """

    article: bool
    loss: Mapping[str, Any]
    sampler_n: tuple[int, ...]
    sampler_compiled_n: tuple[int, ...]
    loader: Mapping[str, Any]
    parallel: Mapping[str, Any]
    rounds: int
    nvml_seconds: float


ARTICLE = HeadlineSizes(
    article=True, loss={"batch": 256, "image_size": 256},
    sampler_n=(1_000, 10_000, 100_000, 1_000_000, 10_000_000), sampler_compiled_n=(10_000, 100_000),
    loader={"image_size": 512, "batch": 32, "num_workers": 8, "image_format": "jpeg"},
    parallel={"world_size": 4, "batch": 8, "image_size": 512}, rounds=10, nvml_seconds=2.0)
SMALL = HeadlineSizes(
    article=False, loss={"batch": 2, "image_size": 16}, sampler_n=(1_000, 10_000), sampler_compiled_n=(1_000,),
    loader={"image_size": 32, "batch": 4, "items": 8, "num_workers": 1}, parallel={"world_size": 2, "batch": 2,
                                                                                    "image_size": 16},
    rounds=5, nvml_seconds=0.2)
WARMUP_EAGER, WARMUP_COMPILED = 2, 4
# The sampler's batched rows: the article's batch of 32 rows per call.
SAMPLER_BATCH = 32


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 4)


def _value(figure: Any) -> Any:
    return f"unavailable: {figure.reason}" if isinstance(figure, Unavailable) else figure


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
    return {"sync_hazards": measure.sync_hazards(case), "cuda_syncs": _value(measure.cuda_syncs(case))}


def _busy(case: Case, seconds: float) -> Any:
    """NVML's mean GPU busy percent while the case loops (n/a with the reason off a GPU)."""
    summary = measure.nvml_window(case, case.device, seconds)
    if not isinstance(summary, NvmlSummary):
        return _value(summary)
    metric = summary.utilization_pct
    return _value(metric) if isinstance(metric, Unavailable) else round(metric.mean, 1)


def _against(name: str, device: str, sizes: HeadlineSizes, params: Mapping[str, Any], candidates: Sequence[str],
             *, compiled: bool = False, extra: Callable[[Case, Case], dict[str, Any]] | None = None,
             rows: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Each candidate against the family's naive variant run eagerly, at ``params``, by the one speedup routine."""
    rows = section_rows() if rows is None else rows
    entry = family(name)
    with _built(name, entry.baseline, device, False, params, rows) as naive:
        if naive is None:
            return rows
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
                    row.update({f"variant_{key}": value for key, value in _syncs(candidate).items()})
                if extra is not None:
                    row.update(extra(naive, candidate))
                rows.append(row)
    return rows


def loss(device: str, sizes: HeadlineSizes) -> list[dict[str, Any]]:
    """Article 000: every loss variant and the floor against naive, one training step each (ms, ratio, syncs, and
    NVML busy of both sides: a step that keeps the GPU busy has little to gain from removing its syncs)."""
    entry = family("loss")

    def busy(naive: Case, candidate: Case) -> dict[str, Any]:
        return {"naive_busy_pct": _busy(naive, sizes.nvml_seconds),
                "variant_busy_pct": _busy(candidate, sizes.nvml_seconds)}

    return _against("loss", device, sizes, sizes.loss, entry.cases[1:], extra=busy)


def sampler_eager(device: str, sizes: HeadlineSizes) -> list[dict[str, Any]]:
    """Article 004, eager: the static sampler against nonzero at each N, one row of N items per call."""
    rows = section_rows()
    for n in sizes.sampler_n:
        _against("sampler", device, sizes, {"n": n, "batch": 1}, ("static",), rows=rows)
    return rows


def sampler_compiled(device: str, sizes: HeadlineSizes) -> list[dict[str, Any]]:
    """Article 004, compiled: torch.compile'd static against eager nonzero (which cannot compile whole) at each N."""
    rows = section_rows()
    for n in sizes.sampler_compiled_n:
        _against("sampler", device, sizes, {"n": n, "batch": 1}, ("static",), compiled=True, rows=rows)
    return rows


def sampler_batched(device: str, sizes: HeadlineSizes, compiled: bool = False) -> list[dict[str, Any]]:
    """Article 004, batched: one static call over 32 rows against nonzero's Python loop over them, at each N."""
    rows = section_rows()
    for n in sizes.sampler_n:
        _against("sampler", device, sizes, {"n": n, "batch": SAMPLER_BATCH}, ("static",), compiled=compiled,
                 rows=rows)
    return rows


def loader(device: str, sizes: HeadlineSizes) -> list[dict[str, Any]]:
    """Article 001: naive against uint8 at the article's batch: bytes per batch, samples/s (steady state), NVML
    busy while batches are delivered, and the batches and bytes the workers hold in flight at rest."""
    from pitfalls.families.loader import probes

    rows = section_rows()
    params = dict(sizes.loader)
    for variant in ("naive", "uint8"):
        row: dict[str, Any] = {"family": "loader", "variant": variant, "sizes": params}
        try:
            row["bytes_per_batch"] = probes.bytes_per_batch(variant, device, **params)
            flight = probes.in_flight(variant, device, **params)
            row["batches_in_flight"] = flight.batches
            row["bytes_in_flight"] = _value(flight.measured_bytes)
            with family("loader").build(variant, device=device, **params) as case:
                row["samples_per_s"] = round(probes.samples_per_second(probes.batch_step(case)), 2)
                row["busy_pct"] = _busy(case, sizes.nvml_seconds)
        except SkipCase as skip:
            row["skipped"] = skip.reason
        rows.append(row)
    return rows


def parallel(device: str, sizes: HeadlineSizes) -> list[dict[str, Any]]:
    """Article 001: DataParallel against DDP: step time, samples/s, device 0's memory and the memory imbalance."""
    from pitfalls.families.parallel import measure_figures

    rows = section_rows()
    params = dict(sizes.parallel)
    for variant in family("parallel").variants:
        row: dict[str, Any] = {"family": "parallel", "variant": variant, "sizes": params}
        try:
            with family("parallel").build(variant, device=device, **params) as case:
                figures = measure_figures(case, steps=3, nvml_seconds=sizes.nvml_seconds)
        except SkipCase as skip:
            row["skipped"] = skip.reason
            rows.append(row)
            continue
        row.update({"step_ms": _value(figures.step_s if isinstance(figures.step_s, Unavailable)
                                      else _ms(figures.step_s)),
                    "samples_per_s": _value(figures.samples_per_s),
                    "device0_bytes": _value(figures.rank0_memory()),
                    "memory_imbalance": _value(figures.memory_imbalance())})
        rows.append(row)
    return rows

"""What a published figure is, measured one way wherever it is published: asv, `pitfalls calibrate`, the GPU proof
and the budgeted GPU run all call these, each with its own sizes (a case built once per process and warmed up, the
one speedup routine, syncs, the one NVML window, peak memory, torch.compile's figures, a table over parameter sets).

A figure that cannot be measured here is a `SkipCase` with the reason (a case) or an `Unavailable` (one figure),
never a 0; the asv suite turns them into n/a (benchmarks/common.py).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch

from pitfalls.cases import build_case
from pitfalls.devices import cuda_available, fits, resolve_device, synchronize
from pitfalls.family import Case, SkipCase
from pitfalls.grids import COMPILE_FAILURES_ENV
from pitfalls.probes.compiled import compile_failure_reason, compile_probe
from pitfalls.probes.nvml import NvmlSummary, nvml_windows
from pitfalls.probes.syncs import count_cuda_syncs, count_hazards
from pitfalls.probes.timing import BLOCKED_SECONDS, Speedup, case_speedup
from pitfalls.registry import family as family_entry
from pitfalls.result import Unavailable
from pitfalls.units import MIB

__all__ = ["MODES", "NVML_WINDOW_S", "SPEEDUP_BLOCKS", "SPEEDUP_ROUNDS", "WARMUP_CALLS", "CompileFigures",
           "case", "case_table", "cold_compile_cache", "compile_figures", "compile_table", "compiled",
           "cuda_peak_mib", "cuda_syncs", "initialize_compiler", "lookup", "nvml_mean", "nvml_window",
           "speedup", "step", "sync_hazards"]

T = TypeVar("T")
MODES = ("eager", "compiled")
# Warm-up calls made when a case is built, outside every timed call: the first compiles (compiled mode) or fills
# the allocator's caches; the second is a steady-state call.
WARMUP_CALLS = 2
# Calls counted by the CUDA sync counter (the per-call figure is the total over them).
SYNC_COUNT_CALLS = 5
# Seconds a published NVML figure loops its case while NVML samples.
NVML_WINDOW_S = 2.0
# The speedup's effort where the caller does not choose (the asv quick grid's): interleaved rounds, block pairs.
SPEEDUP_ROUNDS = 10
SPEEDUP_BLOCKS = 5

_CASES: dict[tuple[Any, ...], Case] = {}


def compiled(mode: str) -> bool:
    """Turn a ``mode`` ("eager" or "compiled") into `build_case`'s flag."""
    if mode not in MODES:
        raise ValueError(f"mode={mode!r} is not a mode; allowed: {', '.join(MODES)}")
    return mode == "compiled"


def _failure_recorded(case_key: str) -> str | None:
    path = os.environ.get(COMPILE_FAILURES_ENV)
    if not path or not os.path.exists(path):
        return None
    for line in Path(path).read_text().splitlines():
        entry = json.loads(line)
        if entry["case"] == case_key:
            return str(entry["reason"])
    return None


@contextlib.contextmanager
def _compile_failure_as_skip(case_key: str | None = None) -> Iterator[None]:
    # An inductor crash while compiling is a torch bug of that version: the figure cannot be measured here.
    try:
        yield
    except torch._dynamo.exc.BackendCompilerFailed as error:
        reason = compile_failure_reason(error)
        path = os.environ.get(COMPILE_FAILURES_ENV)
        if case_key is not None and path:
            # One short line appended by one write: processes that record at once do not mix their lines.
            with open(path, "a", encoding="utf-8") as file:
                file.write(json.dumps({"case": case_key, "reason": reason}) + "\n")
        raise SkipCase(reason) from error


def case(family: str, variant: str, device: str, mode: str, **sizes: Any) -> Case:
    """The case built and warmed up, built once per process (asv-runner runs ``setup()`` before every timed call).

    Args:
        family: a registered family.
        variant: one of its variants, or "floor".
        device: "cpu" or "cuda".
        mode: "eager" or "compiled".
        **sizes: the family's parameters (the others take their defaults).

    Returns:
        The case, called `WARMUP_CALLS` times and synchronized.

    Raises:
        SkipCase: the case cannot run here (no such device, too big, a compiler crash of this torch).
    """
    key = (family, variant, device, mode, tuple(sorted(sizes.items())))
    if key not in _CASES:
        case_key = json.dumps([torch.__version__, *key[:4], sorted(sizes.items())], default=str)
        if compiled(mode) and (reason := _failure_recorded(case_key)) is not None:
            raise SkipCase(reason)
        with _compile_failure_as_skip(case_key):
            built = build_case(family, variant, device=device, compiled=compiled(mode), **sizes)
            for _ in range(WARMUP_CALLS):
                built()
            synchronize(built.device)
        _CASES[key] = built
    return _CASES[key]


def step(c: Case) -> None:
    """One call of a case, the device waited for, so that a timer sees the whole call."""
    c()
    synchronize(c.device)


def speedup(baseline: Case, candidate: Case, *, rounds: int = SPEEDUP_ROUNDS, blocks: int = SPEEDUP_BLOCKS,
            calls: int = 1, seconds: float = BLOCKED_SECONDS) -> Speedup:
    """The speedup of ``candidate`` over ``baseline`` by the suite's one routine (`case_speedup`): A B A B in one
    process, call by call, or by steady-state blocks of ``calls`` calls (for ``seconds`` at least) for cases with
    workers or ranks."""
    return case_speedup(baseline, candidate, rounds=rounds, blocks=blocks, calls=calls, seconds=seconds,
                        sync=lambda: synchronize(candidate.device))


def sync_hazards(c: Case) -> int:
    """Sync-hazard ops (data-dependent shapes or values) dispatched by one call of the case's eager program."""
    return count_hazards(c).total


def cuda_syncs(c: Case) -> float | Unavailable:
    """Host-device synchronizations per call, counted by PyTorch's sync debug mode (CUDA only)."""
    counted = count_cuda_syncs(c, calls=SYNC_COUNT_CALLS, warmup=1)
    return counted if isinstance(counted, Unavailable) else counted.per_call


def nvml_window(call: Callable[[], Any], device: torch.device, seconds: float) -> NvmlSummary | Unavailable:
    """Loop ``call`` for ``seconds`` while NVML samples ``device``'s GPU; what NVML saw.

    The calls are queued without a synchronize between them, as a training loop queues its steps; the device is
    synchronized once at the end, inside the window, so the last calls' work is sampled too.

    Args:
        call: one call of the case (a step, a batch).
        device: where it runs (off a GPU the window is `Unavailable` with the reason).
        seconds: the window's length.

    Returns:
        NVML's summary of the window, or why NVML could not read it.
    """
    if device.type != "cuda":
        return Unavailable(f"case runs on {device}: no GPU for NVML to read")
    [summary] = nvml_windows(call, [device], seconds)
    return summary


def nvml_mean(window: NvmlSummary | Unavailable, metric: str) -> float | Unavailable:
    """The mean of one NVML metric over a window ("utilization_pct", "memory_used_mib", "power_w"), or why not."""
    if isinstance(window, Unavailable):
        return window
    summary = getattr(window, metric)
    return summary if isinstance(summary, Unavailable) else float(summary.mean)


def cuda_peak_mib(c: Case) -> float:
    """Peak CUDA memory allocated by one call of the case, in MiB (the allocator's high-water mark)."""
    synchronize(c.device)
    torch.cuda.reset_peak_memory_stats(c.device)
    step(c)
    return torch.cuda.max_memory_allocated(c.device) / MIB


def cold_compile_cache() -> contextlib.AbstractContextManager[None]:
    """torch's own fresh-cache context: in-memory compile caches cleared, inductor and Triton on-disk caches in a
    new empty folder, so a compile time is a first compile even after other cases compiled in this process."""
    from torch._inductor import utils as inductor_utils

    # Named fresh_inductor_cache before torch 2.6 and kept as an alias for a while after.
    fresh = getattr(inductor_utils, "fresh_cache", None) or inductor_utils.fresh_inductor_cache
    return fresh()


@dataclass(frozen=True)
class CompileFigures:
    """torch.compile figures of one case: compile seconds (first call minus a steady call, cold caches), graph
    breaks at the first size, and graphs compiled again over the rest of a size sweep (0 without a sweep)."""

    compile_s: float
    graph_breaks: int
    recompiles: int


def _fitting(family: str, device: str, sweep: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The sizes of a sweep that fit in memory here, by estimate, before anything is allocated."""
    where = resolve_device(device)
    kept, reasons = [], []
    for sizes in sweep:
        ok, reason = fits(where, family_entry(family).estimate_bytes(sizes))
        if ok:
            kept.append(sizes)
        else:
            reasons.append(f"{sizes}: {reason}")
    if not kept:
        raise SkipCase("; ".join(reasons))
    return kept


_COMPILER_READY: set[torch.device] = set()


def initialize_compiler(device: torch.device) -> None:
    """Compile a throw-away function once per process and device, so that inductor's own start-up (imports,
    code generators, Triton: seconds) is not billed to whichever case is compiled first."""
    if device not in _COMPILER_READY:
        with cold_compile_cache():
            torch.compile(torch.add)(torch.ones(2, device=device), torch.ones(2, device=device))
        synchronize(device)
        _COMPILER_READY.add(device)


def compile_figures(family: str, variant: str, device: str, sweep: Sequence[dict[str, Any]]) -> CompileFigures:
    """Compile a case's eager program afresh, with cold caches, and call it at each size of ``sweep``.

    Args:
        family: a registered family.
        variant: the family's variant, or "floor".
        device: "cpu" or "cuda".
        sweep: size dicts; those that do not fit are dropped first. The first is compiled and timed; each later
            one is called once to see whether it recompiles. Each size's inputs are built when the probe reaches it.

    Returns:
        The `CompileFigures`.

    Raises:
        SkipCase: the figures cannot be measured here (the reason says why).
    """
    if device.split(":")[0] == "cuda" and not cuda_available():
        raise SkipCase("no CUDA device")
    kept = _fitting(family, device, sweep)
    with _compile_failure_as_skip():
        first = build_case(family, variant, device=device, **kept[0])
        if first.fn is None:
            raise SkipCase(f"{first.name} is no single function of its inputs: nothing to compile")

        def inputs(sizes: dict[str, Any]) -> tuple[Any, ...]:
            return first.inputs if sizes is kept[0] else build_case(family, variant, device=device, **sizes).inputs

        initialize_compiler(first.device)
        with cold_compile_cache():
            report = compile_probe(first.fn, inputs, kept, sync=lambda: synchronize(first.device))
    return CompileFigures(compile_s=report.compile_s, graph_breaks=report.graph_breaks,
                          recompiles=report.recompiled_graphs)


def case_table(measure: Callable[..., T], param_names: Sequence[str],
               params: Sequence[Sequence[Any]]) -> dict[tuple[Any, ...], T | str]:
    """``measure(**named)`` of every parameter set, measured one after the other in this process, or the reason a
    set cannot be measured here (its `SkipCase`).

    ``measure`` builds its own case, measures it and closes it, so no two cases are live at once: it is what a
    benchmark's ``setup_cache`` measures once per run, each figure then looked up per set (`lookup`).
    """
    table: dict[tuple[Any, ...], T | str] = {}
    for values in itertools.product(*params):  # every parameter set, as asv passes them to ``setup``
        try:
            table[values] = measure(**dict(zip(param_names, values, strict=True)))
        except SkipCase as skip:
            table[values] = skip.reason
    return table


def lookup(table: dict[tuple[Any, ...], T | str], params: Sequence[Any]) -> T:
    """A parameter set's figures in a `case_table`.

    Raises:
        SkipCase: the set could not be measured (with the reason the table holds).
    """
    found = table[tuple(params)]
    if isinstance(found, str):
        raise SkipCase(found)
    return found


def compile_table(family: str, param_names: Sequence[str], params: Sequence[Sequence[Any]],
                  sweep: tuple[str, Sequence[Any]] | None = None) -> dict[tuple[Any, ...], CompileFigures | str]:
    """`compile_figures` of every parameter set (``variant``, ``device`` and sizes), each compiled once, in one
    process; ``sweep`` is (size name, values) swept inside each case, e.g. ("n", (1000, 10000)) for recompiles."""

    def measure(variant: str, device: str, **sizes: Any) -> CompileFigures:
        swept = [sizes] if sweep is None else [{**sizes, sweep[0]: value} for value in sweep[1]]
        return compile_figures(family, variant, device, swept)

    return case_table(measure, param_names, params)

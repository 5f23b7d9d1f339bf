"""What the asv benchmark classes share: parameter grids, the device axis, a per-process case cache, skips.

The benchmark modules stay thin (params on the class, one delegating line per method); the logic lives here and in
the pitfalls package.

Grids. ``PITFALLS_GRID=quick`` (the default) is small enough for a 2-core CPU to finish in minutes;
``PITFALLS_GRID=full`` adds the articles' sizes (loss batch 256 at 256x256, sampler N up to 1e7). Cases that
would not fit in memory are skipped by an estimate before anything is allocated.

Forking. asv runs these modules under a forkserver (see asv.conf.json): they are imported once by a server
that then forks a child per benchmark. Nothing at import time may touch CUDA, not even
``torch.cuda.is_available()``, or every forked child would inherit a CUDA context it cannot use. Every CUDA
call happens in ``setup()``, inside the child.

Skips. A figure that cannot be measured here is never 0: ``setup()`` raises ``NotImplementedError(reason)``,
which asv records as n/a (``asv run --show-stderr`` prints the reason). Where one figure of a class is
unavailable and the others are not, the method raises asv's ``SkipNotImplemented`` instead (see ``figure``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from asv_runner.benchmarks.mark import SkipNotImplemented

from pitfalls import registry
from pitfalls.cases import DEFAULT_PARAMS, Case, SkipCase, build_case, estimate_bytes
from pitfalls.devices import cuda_available, fits, resolve_device, synchronize
from pitfalls.probes import (
    NvmlSampler,
    NvmlSummary,
    Unavailable,
    compile_probe,
    count_cuda_syncs,
    count_hazards,
    interleaved_speedup,
)

T = TypeVar("T")

GRID_ENV = "PITFALLS_GRID"
ROUNDS_ENV = "PITFALLS_ROUNDS"
DEVICES = ("cpu", "cuda")
MODES = ("eager", "compiled")


@dataclass(frozen=True)
class Grid:
    """The sizes one grid sweeps, and how long asv may spend timing each case.

    Attributes:
        name: "quick" or "full".
        loss_batch: loss family batch sizes.
        loss_image_size: loss family image sides (square images).
        sampler_n: sampler family item counts N.
        sampler_batch: sampler family batch sizes (1 = one row).
        rounds: asv ``rounds`` of time_ benchmarks (each round is a fresh process).
        repeat: asv ``repeat`` of time_ benchmarks: (min samples, max samples, max seconds) per round.
        speedup_rounds: A/B rounds of the interleaved speedup.
    """

    name: str
    loss_batch: tuple[int, ...]
    loss_image_size: tuple[int, ...]
    sampler_n: tuple[int, ...]
    sampler_batch: tuple[int, ...]
    rounds: int
    repeat: tuple[int, int, float]
    speedup_rounds: int


GRIDS = {
    "quick": Grid(
        name="quick",
        loss_batch=(4,),
        loss_image_size=(64,),
        sampler_n=(1_000, 10_000, 100_000),
        sampler_batch=(1, 32),
        rounds=1,
        repeat=(5, 20, 2.0),
        speedup_rounds=10,
    ),
    "full": Grid(
        name="full",
        loss_batch=(4, 32, 256),
        loss_image_size=(64, 256),
        sampler_n=(1_000, 10_000, 100_000, 1_000_000, 10_000_000),
        sampler_batch=(1, 32),
        rounds=2,
        repeat=(5, 20, 10.0),
        speedup_rounds=20,
    ),
}


def grid(environ: dict[str, str] | None = None) -> Grid:
    """Return the grid that ``PITFALLS_GRID`` selects ("quick" when unset).

    ``PITFALLS_ROUNDS`` overrides the grid's asv ``rounds`` of the time_ benchmarks: scripts/compare sets 2, so
    that asv interleaves the two commits' rounds (A B, then B A) and machine drift cannot pass for a change.

    Args:
        environ: the environment to read; None means ``os.environ``.

    Returns:
        The selected `Grid`.
    """
    environ = os.environ if environ is None else environ
    name = environ.get(GRID_ENV, "quick")
    if name not in GRIDS:
        raise ValueError(f"{GRID_ENV}={name!r} is not a grid; allowed: {', '.join(GRIDS)}")
    chosen = GRIDS[name]
    rounds = environ.get(ROUNDS_ENV)
    if rounds is None:
        return chosen
    if not rounds.isdigit() or int(rounds) < 1:
        raise ValueError(f"{ROUNDS_ENV}={rounds!r} is not a number of rounds; allowed: an integer >= 1")
    return dataclasses.replace(chosen, rounds=int(rounds))


GRID = grid()
LOSS_VARIANTS = list(registry.variants("loss"))
SAMPLER_VARIANTS = list(registry.variants("sampler"))

# Warm-up calls made in setup, outside every timed call: the first compiles (compiled mode) or fills the
# allocator's caches; the second is a steady-state call.
WARMUP_CALLS = 2
# Seconds the GPU figures sample NVML while the case loops.
NVML_WINDOW_S = 2.0
# Calls counted by the CUDA sync counter (per-call figure = total / calls).
SYNC_COUNT_CALLS = 5

_CASES: dict[tuple[Any, ...], Case] = {}


def compiled(mode: str) -> bool:
    """Turn the ``mode`` parameter ("eager" or "compiled") into build_case's flag."""
    if mode not in MODES:
        raise ValueError(f"mode={mode!r} is not a mode; allowed: {', '.join(MODES)}")
    return mode == "compiled"


def skip(reason: str) -> None:
    """Skip the current benchmark from ``setup()``: asv records it as n/a and prints the reason."""
    raise NotImplementedError(reason)


def require_cuda() -> None:
    """Skip unless CUDA can be used in this process (checked in the forked child, never at import)."""
    if not cuda_available():
        skip("no CUDA device")


@contextlib.contextmanager
def skipping_unavailable_cases() -> Iterator[None]:
    """Turn a case that cannot run here into a skip with its reason.

    ``SkipCase`` (no such device, too big for memory) and an inductor crash while compiling (a torch bug of
    that version, not a slow case) both mean the figure cannot be measured; any other error fails the
    benchmark as it should.
    """
    try:
        yield
    except SkipCase as error:
        skip(error.reason)
    except torch._dynamo.exc.BackendCompilerFailed as error:
        inner = getattr(error, "inner_exception", error)
        message = (str(inner).strip().splitlines() or [""])[0]
        skip(
            f"torch.compile failed on torch {torch.__version__} ({error.backend_name}): "
            f"{type(inner).__name__}: {message}"
        )


def figure(value: T | Unavailable) -> T:
    """Return a measured value, or skip this one benchmark method when the probe could not measure it.

    Raised inside a benchmark method, asv's ``SkipNotImplemented`` records n/a for that method alone (a plain
    NotImplementedError there would be a failure); the reason goes to the benchmark's output.
    """
    if isinstance(value, Unavailable):
        print(f"pitfalls: n/a: {value.reason}", file=sys.stderr)
        raise SkipNotImplemented(value.reason)
    return value


def case(family: str, variant: str, device: str, mode: str, **sizes: int) -> Case:
    """Return the built and warmed-up case, building it once per process.

    asv-runner runs ``setup()`` before every timed call, so this cache is what keeps building and compiling out
    of all but the first.

    Args:
        family: "loss" or "sampler".
        variant: one of the family's variants.
        device: "cpu" or "cuda".
        mode: "eager" or "compiled".
        **sizes: the family's sizes (loss: batch, image_size; sampler: n, batch).

    Returns:
        The case, already called ``WARMUP_CALLS`` times and synchronized.
    """
    key = (family, variant, device, mode, tuple(sorted(sizes.items())))
    if key not in _CASES:
        with skipping_unavailable_cases():
            built = build_case(family, variant, device=device, compiled=compiled(mode), **sizes)
            for _ in range(WARMUP_CALLS):
                built()
            synchronize(built.device)
        _CASES[key] = built
    return _CASES[key]


def step(c: Case) -> None:
    """Run one call of a case and wait for the device, so a timer sees the whole call."""
    c()
    synchronize(c.device)


def speedup(baseline: Case, candidate: Case) -> float:
    """Speedup of ``candidate`` over ``baseline``, timed A B A B in one process (median of per-round ratios)."""
    result = interleaved_speedup(
        baseline,
        candidate,
        rounds=GRID.speedup_rounds,
        warmup=1,
        sync=lambda: synchronize(candidate.device),
    )
    return result.ratio


def sync_hazards(c: Case) -> int:
    """Sync-hazard ops (data-dependent shapes or values) dispatched by one call of the case's eager program."""
    return count_hazards(c).total


def cuda_syncs(c: Case) -> float | Unavailable:
    """Host-device synchronizations per call, counted by PyTorch's sync debug mode (CUDA only)."""
    counted = count_cuda_syncs(c, calls=SYNC_COUNT_CALLS, warmup=1)
    return counted if isinstance(counted, Unavailable) else counted.per_call


def nvml_window(c: Case) -> NvmlSummary | Unavailable:
    """Loop the case for ``NVML_WINDOW_S`` seconds while NVML samples its GPU; return what NVML saw."""
    with NvmlSampler(c.device) as sampler:
        deadline = time.perf_counter() + NVML_WINDOW_S
        while time.perf_counter() < deadline:
            c()
        synchronize(c.device)
    return sampler.summary


def nvml_mean(window: NvmlSummary | Unavailable, metric: str) -> float:
    """The mean of one NVML metric over a window ("utilization_pct", "memory_used_mib", "power_w").

    Skips the calling benchmark method when NVML, or that one metric, was unavailable.
    """
    return figure(getattr(figure(window), metric)).mean


def cuda_peak_mib(c: Case) -> float:
    """Peak CUDA memory allocated by one call of the case, in MiB (the allocator's high-water mark)."""
    synchronize(c.device)
    torch.cuda.reset_peak_memory_stats(c.device)
    step(c)
    return torch.cuda.max_memory_allocated(c.device) / 2**20


def cold_compile_cache() -> contextlib.AbstractContextManager[None]:
    """torch's own fresh-cache context: in-memory compile caches cleared, inductor and Triton on-disk caches in a
    new empty folder, so a compile time is a first compile even after other cases compiled in this process.

    Without it, every case after the first (and every run after the first) would report the time to reuse
    kernels compiled before.
    """
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


def fitting(family: str, device: str, sweep: list[dict[str, int]]) -> list[dict[str, int]]:
    """Keep the sizes of a sweep that fit in memory here, by estimate, before anything is allocated.

    Skips (NotImplementedError with every size's reason) when none fits, or when the device is absent.
    """
    if device == "cuda":
        require_cuda()
    where = resolve_device(device)
    kept, reasons = [], []
    for sizes in sweep:
        ok, reason = fits(where, estimate_bytes(family, {**DEFAULT_PARAMS[family], **sizes}))
        if ok:
            kept.append(sizes)
        else:
            reasons.append(f"{sizes}: {reason}")
    if not kept:
        skip("; ".join(reasons))
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


def compile_figures(family: str, variant: str, device: str, sweep: list[dict[str, int]]) -> CompileFigures:
    """Compile a case's eager program afresh, with cold caches, and call it at each size of ``sweep``.

    Args:
        family: "loss" or "sampler".
        variant: the family's variant.
        device: "cpu" or "cuda".
        sweep: size dicts; those that do not fit are dropped first (see `fitting`). The first is compiled and
            timed; each later one is called once to see whether it recompiles. Each size's inputs are built
            when the probe reaches it.

    Returns:
        The `CompileFigures`.

    Raises:
        NotImplementedError: the figures cannot be measured here (the reason says why).
    """
    sweep = fitting(family, device, sweep)
    with skipping_unavailable_cases():
        first = build_case(family, variant, device=device, **sweep[0])

        def inputs(sizes: dict[str, int]) -> tuple[Any, ...]:
            return first.inputs if sizes is sweep[0] else build_case(family, variant, device=device, **sizes).inputs

        initialize_compiler(first.device)
        with cold_compile_cache():
            report = compile_probe(first.fn, inputs, sweep, sync=lambda: synchronize(first.device))
    return CompileFigures(
        compile_s=report.first_call_s - report.steady_s,
        graph_breaks=report.graph_breaks,
        recompiles=report.recompiled_graphs,
    )


def compile_table(
    family: str,
    param_names: list[str],
    params: list[list[Any]],
    sweep: tuple[str, tuple[int, ...]] | None = None,
) -> dict[tuple[Any, ...], CompileFigures | str]:
    """Compile figures for every parameter set of a class, in one process: its ``setup_cache``.

    torch.compile is the slow part of the suite; measured here once per case, every figure of that case
    (compile seconds, graph breaks, recompiles) comes from the same compile, not one compile per asv process.

    Args:
        family: "loss" or "sampler".
        param_names: the class's ``param_names``; "variant" and "device" are required, the rest are sizes.
        params: the class's ``params``.
        sweep: (size name, values) swept inside each case, e.g. ("n", (1000, 10000)) for recompiles across N.

    Returns:
        ``{parameter set: figures}``, with the reason in place of the figures where they cannot be measured.
    """
    table: dict[tuple[Any, ...], CompileFigures | str] = {}
    for values in itertools.product(*params):
        sizes = dict(zip(param_names, values))
        variant, device = sizes.pop("variant"), sizes.pop("device")
        sizes_sweep = [sizes] if sweep is None else [{**sizes, sweep[0]: v} for v in sweep[1]]
        try:
            table[values] = compile_figures(family, variant, device, sizes_sweep)
        except NotImplementedError as error:
            table[values] = str(error)
    return table


def compiled_figures(table: dict[tuple[Any, ...], CompileFigures | str], params: tuple[Any, ...]) -> CompileFigures:
    """Look a parameter set up in a `compile_table`; skip (from setup) with the reason where it has none."""
    figures = table[tuple(params)]
    if isinstance(figures, str):
        skip(figures)
    return figures

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
import json
import os
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
from asv_runner.benchmarks.mark import SkipNotImplemented

from pitfalls import measure, registry
from pitfalls.cases import Case, SkipCase, build_case, estimate_bytes
from pitfalls.devices import cuda_available, fits, resolve_device, synchronize
from pitfalls.family import COMPILE, CUDA, HAZARDS, NVML, SPEEDUP
from pitfalls.probes import (
    NvmlSummary,
    Unavailable,
    case_speedup,
    compile_failure_reason,
    compile_probe,
    count_cuda_syncs,
    count_hazards,
)

T = TypeVar("T")

GRID_ENV = "PITFALLS_GRID"
ROUNDS_ENV = "PITFALLS_ROUNDS"
DEVICES = ("cpu", "cuda")
MODES = ("eager", "compiled")


@dataclass(frozen=True)
class Grid:
    """How long asv spends on each case of one grid; the sizes each family sweeps are in its entry (``grids``).

    Attributes:
        name: "quick" or "full": the key of every family's ``grids``.
        rounds: asv ``rounds`` of time_ benchmarks (each round is a fresh process).
        repeat: asv ``repeat`` of time_ benchmarks: (min samples, max samples, max seconds) per round.
        speedup_rounds: A/B rounds of the interleaved speedup.
        speedup_blocks: A/B block pairs of the speedup of cases with workers, queues or ranks (`Case.block`).
    """

    name: str
    rounds: int
    repeat: tuple[int, int, float]
    speedup_rounds: int
    speedup_blocks: int = 5


GRIDS = {
    "quick": Grid(name="quick", rounds=1, repeat=(5, 20, 2.0), speedup_rounds=10),
    "full": Grid(name="full", rounds=2, repeat=(5, 20, 10.0), speedup_rounds=20),
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


def axes(family: str) -> dict[str, tuple[Any, ...]]:
    """The parameters the selected grid sweeps for a family, and their values, in axis order."""
    return registry.family(family).axes(GRID.name)


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
        skip(compile_failure_reason(error))


def figure(value: T | Unavailable) -> T:
    """Return a measured value, or skip this one benchmark method when the probe could not measure it.

    Raised inside a benchmark method, asv's ``SkipNotImplemented`` records n/a for that method alone (a plain
    NotImplementedError there would be a failure); the reason goes to the benchmark's output.
    """
    if isinstance(value, Unavailable):
        print(f"pitfalls: n/a: {value.reason}", file=sys.stderr)
        raise SkipNotImplemented(value.reason)
    return value


def case(family: str, variant: str, device: str, mode: str, **sizes: Any) -> Case:
    """Return the built and warmed-up case, building it once per process.

    asv-runner runs ``setup()`` before every timed call, so this cache is what keeps building and compiling out
    of all but the first.

    Args:
        family: a registered family.
        variant: one of the family's variants, or "floor".
        device: "cpu" or "cuda".
        mode: "eager" or "compiled".
        **sizes: the family's parameters (the others take their defaults).

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


def speedup(baseline: Case, candidate: Case, *, units: int = 1) -> float:
    """Speedup of ``candidate`` over ``baseline``, timed A B A B in one process (median of per-round ratios).

    Cases with workers, queues or ranks (a ``block``) are compared by steady-state blocks, one case live at a
    time (``units`` calls per block); the others call by call.
    """
    return case_speedup(baseline, candidate, rounds=GRID.speedup_rounds, blocks=GRID.speedup_blocks, units=units,
                        sync=lambda: synchronize(candidate.device)).ratio


def sync_hazards(c: Case) -> int:
    """Sync-hazard ops (data-dependent shapes or values) dispatched by one call of the case's eager program."""
    return count_hazards(c).total


def cuda_syncs(c: Case) -> float | Unavailable:
    """Host-device synchronizations per call, counted by PyTorch's sync debug mode (CUDA only)."""
    counted = count_cuda_syncs(c, calls=SYNC_COUNT_CALLS, warmup=1)
    return counted if isinstance(counted, Unavailable) else counted.per_call


def nvml_window(c: Case) -> NvmlSummary | Unavailable:
    """Loop the case for ``NVML_WINDOW_S`` seconds while NVML samples its GPU; return what NVML saw."""
    return measure.nvml_window(c, c.device, NVML_WINDOW_S)


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
        ok, reason = fits(where, estimate_bytes(family, sizes))
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
        family: a registered family.
        variant: the family's variant, or "floor".
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
        compile_s=report.compile_s,
        graph_breaks=report.graph_breaks,
        recompiles=report.recompiled_graphs,
    )


def parameter_sets(
    param_names: list[str], params: list[list[Any]]
) -> Iterator[tuple[tuple[Any, ...], str, str, dict[str, Any]]]:
    """Every parameter set of a class, for a ``setup_cache`` that measures them all in one process.

    Yields:
        (the values as asv passes them to ``setup``, the variant, the device, the other parameters by name).
    """
    for values in itertools.product(*params):
        sizes = dict(zip(param_names, values, strict=True))
        yield values, sizes.pop("variant"), sizes.pop("device"), sizes


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
        family: a registered family.
        param_names: the class's ``param_names``; "variant" and "device" are required, the rest are sizes.
        params: the class's ``params``.
        sweep: (size name, values) swept inside each case, e.g. ("n", (1000, 10000)) for recompiles across N.

    Returns:
        ``{parameter set: figures}``, with the reason in place of the figures where they cannot be measured.
    """
    table: dict[tuple[Any, ...], CompileFigures | str] = {}
    for values, variant, device, sizes in parameter_sets(param_names, params):
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


# --------------------------------------------------------------------------------------------------------------
# The shared benchmark shapes. A family's module subclasses them with ``family = "<name>"`` and nothing else
# but the names asv must see there: params and units come from the family's entry. Their names start with "_",
# so asv does not collect the bases themselves.


# asv keeps a benchmark's results only while its ``version`` is unchanged; by default the version is a hash of the
# benchmark's source. Moving the benchmarks onto the bases below changed that source, not what is measured, so
# these benchmarks keep the versions their history in results/ carries (benchmarks/series.json). Each pin holds
# only with the method hash recorded next to it (pitfalls.series_guard; tests/test_series_guard.py checks it):
# when what a benchmark measures changes, `scripts/series restart` gives it a new version and its series restarts.
SERIES_VERSIONS = {name: pin["version"] for name, pin in
                   json.loads((Path(__file__).parent / "series.json").read_text()).items()}


def _method_copy(function: Any, name: str, **attributes: Any) -> Any:
    """A copy of ``function`` under ``name`` with its own attributes: the ones asv reads (unit, version) belong
    to one family's class although the code is shared."""
    copy = types.FunctionType(function.__code__, function.__globals__, name, function.__defaults__,
                              function.__closure__)
    copy.__dict__.update(function.__dict__)
    for key, value in attributes.items():
        setattr(copy, key, value)
    return copy


class _FamilyBenchmark:
    """A benchmark class of one family: its axes are the variants and the floor, then the grid's parameters.

    Subclasses set ``family``; ``__init_subclass__`` fills ``param_names`` and ``params`` from the family's entry,
    gives each benchmark method its own unit, and pins the asv ``version`` of the methods in `SERIES_VERSIONS`.
    """

    family: str = ""
    device_axis = True
    mode_axis = True
    # The unit of each benchmark method; "{unit}" becomes what one call of the family is ("step", "call").
    units: dict[str, str] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not cls.family:
            return
        entry = registry.family(cls.family)
        sizes = {name: values for name, values in entry.axes(GRID.name).items() if name != cls.sweep_axis()}
        names, values = ["variant", *sizes], [list(entry.cases), *map(list, sizes.values())]
        if cls.device_axis:
            names.append("device")
            values.append(list(DEVICES))
        if cls.mode_axis and COMPILE in entry.figures:  # a family with nothing to compile has no compiled column
            names.append("mode")
            values.append(list(MODES))
        cls.param_names, cls.params = names, values
        pinned = f"{cls.__module__.rpartition('.')[2]}.{cls.__name__}."
        for name in dir(cls):
            attributes = {}
            if name in cls.units:
                attributes["unit"] = cls.units[name].format(unit=entry.unit)
            if pinned + name in SERIES_VERSIONS:
                attributes["version"] = SERIES_VERSIONS[pinned + name]
            if attributes:
                setattr(cls, name, _method_copy(getattr(cls, name), name, **attributes))

    @classmethod
    def sweep_axis(cls) -> str | None:
        return None

    def arguments(self, params: tuple[Any, ...]) -> dict[str, Any]:
        """The parameters asv passed to setup, by name."""
        return dict(zip(self.param_names, params, strict=True))  # type: ignore[attr-defined]

    def build(self, params: tuple[Any, ...], **replaced: Any) -> Case:
        """The case of one parameter set, built once per process; ``replaced`` overrides some parameters."""
        args = {**self.arguments(params), **replaced}
        variant, device, mode = args.pop("variant"), args.pop("device"), args.pop("mode", "eager")
        return case(self.family, variant, device, mode, **args)


class _Time(_FamilyBenchmark):
    """Time and host peak memory of one call. `family_classes` names the methods after the family's call
    (``time_step``, ``peakmem_step``)."""

    rounds = GRID.rounds
    repeat = GRID.repeat

    def setup(self, *params: Any) -> None:
        self.case = self.build(params)

    def _time(self, *params: Any) -> None:
        step(self.case)

    def _peakmem(self, *params: Any) -> None:
        step(self.case)


class _Speedup(_FamilyBenchmark):
    """Speedup over the article's starting point, the naive variant run eagerly (same sizes and device), timed
    interleaved A B A B in one process. In compiled mode it is the gain of rewriting and compiling together."""

    units = {"track_speedup": "x"}

    def setup(self, *params: Any) -> None:
        self.naive = self.build(params, variant=registry.baseline(self.family), mode="eager")
        self.case = self.build(params)

    def track_speedup(self, *params: Any) -> float:
        return speedup(self.naive, self.case)


class _SyncHazards(_FamilyBenchmark):
    """Ops with data-dependent output shapes or values in one call (each a host-device sync on a GPU).

    Counted on the eager program on any device; compiled mode has no column because the counter runs a compiled
    region eagerly.
    """

    mode_axis = False
    units = {"track_sync_hazards": "hazards/{unit}"}

    def setup(self, *params: Any) -> None:
        self.case = self.build(params)

    def track_sync_hazards(self, *params: Any) -> int:
        return sync_hazards(self.case)


class _Compile(_FamilyBenchmark):
    """torch.compile of the case's eager program with cold caches: compile seconds and graph breaks; where the
    family sweeps a parameter inside one process (its ``compile_sweep``), also the graphs compiled again along it.

    With a ``setup_cache`` (see `family_classes`) every case is compiled once, in one process for the class, and
    each figure is looked up per case; without one, each process compiles its own case.
    """

    mode_axis = False
    timeout = 3600
    units = {"track_compile_seconds": "seconds", "track_graph_breaks": "breaks", "track_recompiles": "graphs"}

    @classmethod
    def sweep_axis(cls) -> str | None:
        return registry.family(cls.family).compile_sweep

    def _table(self, params: list[list[Any]] | None = None) -> dict[tuple[Any, ...], CompileFigures | str]:
        axis = self.sweep_axis()
        sweep = None if axis is None else (axis, axes(self.family)[axis])
        return compile_table(self.family, self.param_names, params or self.params, sweep=sweep)  # type: ignore[attr-defined]

    def _setup_cache(self) -> dict[tuple[Any, ...], CompileFigures | str]:
        return self._table()

    def setup(self, *args: Any) -> None:
        # asv passes setup_cache's table first where the class has one.
        if hasattr(self, "setup_cache"):
            table, params = args[0], args[1:]
        else:
            params = args
            table = self._table([[value] for value in params])
        self.figures = compiled_figures(table, params)

    def track_compile_seconds(self, *params: Any) -> float:
        return self.figures.compile_s

    def track_graph_breaks(self, *params: Any) -> int:
        return self.figures.graph_breaks


class _CompileSweep(_Compile):
    """`_Compile` for a family with a ``compile_sweep``: also the recompiles along the swept parameter."""

    def track_recompiles(self, *params: Any) -> int:
        return self.figures.recompiles


class _Cuda(_FamilyBenchmark):
    """What CUDA itself reports for one call: real host-device syncs (sync debug mode) and peak allocated memory."""

    device_axis = False
    units = {"track_cuda_syncs": "syncs/{unit}", "track_cuda_peak_memory": "MiB"}

    def setup(self, *params: Any) -> None:
        require_cuda()
        self.case = self.build(params, device="cuda")

    def track_cuda_syncs(self, *params: Any) -> float:
        return figure(cuda_syncs(self.case))

    def track_cuda_peak_memory(self, *params: Any) -> float:
        return cuda_peak_mib(self.case)


class _Nvml(_FamilyBenchmark):
    """What NVML sees while calls loop for a few seconds: GPU busy percent, memory in use, power. CUDA only."""

    device_axis = False
    units = {"track_gpu_busy": "%", "track_gpu_memory": "MiB", "track_gpu_power": "W"}

    def setup(self, *params: Any) -> None:
        require_cuda()
        self.window = nvml_window(self.build(params, device="cuda"))

    def track_gpu_busy(self, *params: Any) -> float:
        return nvml_mean(self.window, "utilization_pct")

    def track_gpu_memory(self, *params: Any) -> float:
        return nvml_mean(self.window, "memory_used_mib")

    def track_gpu_power(self, *params: Any) -> float:
        return nvml_mean(self.window, "power_w")


# The class each figure of a family's entry becomes, and its name in the family's benchmark module.
_FIGURE_CLASSES = (
    (SPEEDUP, "Speedup", _Speedup),
    (HAZARDS, "SyncHazards", _SyncHazards),
    (COMPILE, "Compile", _Compile),
    (CUDA, "Cuda", _Cuda),
    (NVML, "Nvml", _Nvml),
)


def family_classes(family: str, module: str, *, time: tuple[str, str], prefix: str = "",
                   compile_cache: bool = True) -> dict[str, type]:
    """The shared benchmark classes of one family, by name, for its benchmark module's namespace.

    Args:
        family: the registered family.
        module: the ``__name__`` of the module the classes belong to (asv names benchmarks after it).
        time: (class name, call name) of the time class: ("Step", "step") gives ``Step.time_step`` and
            ``Step.peakmem_step``.
        prefix: put before every other class name (families that share one module).
        compile_cache: give the compile class a ``setup_cache``, so every case compiles once in one process.
            asv keys that cache by the module and line of ``setup_cache``, so only one family per module may.

    Returns:
        The time class, then Speedup, SyncHazards, Compile, Cuda and Nvml where the family's figures include them.
    """
    entry = registry.family(family)
    time_class, call = time
    made = {time_class: (_Time, {f"time_{call}": _method_copy(_Time._time, f"time_{call}"),
                                 f"peakmem_{call}": _method_copy(_Time._peakmem, f"peakmem_{call}")})}
    for figure_name, name, base in _FIGURE_CLASSES:
        if figure_name not in entry.figures:
            continue
        namespace: dict[str, Any] = {}
        if base is _Compile:
            base = _CompileSweep if entry.compile_sweep else _Compile
            if compile_cache:
                namespace["setup_cache"] = _method_copy(_Compile._setup_cache, "setup_cache", __module__=module)
        made[prefix + name] = (base, namespace)
    # A family with nothing to compile has no eager/compiled axis: a "compiled" column could only ever fail.
    modes = {} if COMPILE in entry.figures else {"mode_axis": False}
    classes = {}
    for name, (base, namespace) in made.items():
        doc = f"{(base.__doc__ or '').strip()}\n\nFamily {family} (article {entry.article}): {entry.summary}."
        classes[name] = type(name, (base,), {**namespace, **modes, "family": family, "__module__": module,
                                              "__qualname__": name, "__doc__": doc})
    return classes


def plugin_classes(module: str) -> dict[str, type]:
    """The shared benchmark classes of every family registered by another package or ``PITFALLS_FAMILIES``.

    Each family's classes are named after it (family ``item_loop``: ``ItemLoopTime.time_call``,
    ``ItemLoopSpeedup.track_speedup``...). They share one module, so their compile classes compile per process
    (see `family_classes`).
    """
    classes: dict[str, type] = {}
    for entry in registry.plugin_families():
        prefix = "".join(part.capitalize() for part in entry.name.replace("-", "_").split("_"))
        classes.update(family_classes(entry.name, module, time=(f"{prefix}Time", "call"), prefix=prefix,
                                      compile_cache=False))
    return classes


# --------------------------------------------------------------------------------------------------------------
# The calibration table over commits: each check of `pitfalls calibrate` is a parameter, its error the value.


def calibration_error(check: str) -> float:
    """The error of one calibration check measured here, as `pitfalls calibrate` judges it; skips (from setup) with
    the reason where the check cannot run (a CUDA check without a CUDA device), so it is n/a and never 0."""
    from pitfalls.calibration import published

    error = published.measured_error(check, "cuda" if cuda_available() else "cpu")
    if isinstance(error, Unavailable):
        skip(error.reason)
    return error


class _CalibrationError:
    """A calibration check's error (`pitfalls calibrate`'s ``error`` column), whatever its verdict: relative to
    the planted value, or in the check's unit where its tolerance is absolute. One process per check."""

    own_axes = True  # the axis is the calibration checks, not the family's cases
    param_names = ["check"]
    timeout = 600

    def setup(self, check: str) -> None:
        self.error = calibration_error(check)

    def track_error(self, check: str) -> float:
        return self.error


def calibration_error_classes(module: str) -> dict[str, type]:
    """The calibration error classes, by name, for the module's namespace: one per unit of error, whose ``check``
    axis is every check of `pitfalls.calibration.run.all_checks` with an error in that unit.

    Args:
        module: the ``__name__`` of the module the classes belong to.

    Returns:
        ``{"Error": class, "ErrorInPercent": class, ...}``.
    """
    from pitfalls.calibration import published
    from pitfalls.calibration.run import all_checks

    classes: dict[str, type] = {}
    for unit, names in published.checks_by_error_unit(all_checks()).items():
        name = published.error_class_name(unit)
        method = _method_copy(_CalibrationError.track_error, published.ERROR_METHOD, unit=unit)
        classes[name] = type(name, (_CalibrationError,), {
            "params": [names], published.ERROR_METHOD: method, "__module__": module, "__qualname__": name,
            "__doc__": f"{(_CalibrationError.__doc__ or '').strip()}\n\nThe checks whose error is in {unit!r}."})
    return classes

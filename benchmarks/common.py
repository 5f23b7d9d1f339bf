"""What the asv suite adds to `pitfalls.measure`: its grids, its n/a adapters, its base class and the shapes of the
figures every family has.

asv runs these modules under a forkserver (asv.conf.json): imported once, then forked per benchmark, so nothing at
import time may touch CUDA; every CUDA call happens in ``setup()``, in the child. A figure that cannot be measured
here is never 0: ``setup()`` raises ``NotImplementedError(reason)`` (n/a for the class's case), a method
``SkipNotImplemented`` (n/a for that figure). Every benchmark's asv ``version`` comes from benchmarks/series.json,
applied here and nowhere else, each pin held to its method by `pitfalls.series_guard` (``scripts/series``).
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import json
import os
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from asv_runner.benchmarks.mark import SkipNotImplemented

from pitfalls import measure, registry
from pitfalls.devices import cuda_available
from pitfalls.family import COMPILE, Case, SkipCase
from pitfalls.grids import chosen_grid
from pitfalls.probes import Unavailable

T = TypeVar("T")

DEVICES = ("cpu", "cuda")
NVML_WINDOW_S = measure.NVML_WINDOW_S


@dataclass(frozen=True)
class Grid:
    """How long asv spends on each case of one grid (``quick``: minutes on a 2-core CPU; ``full``: the articles'
    sizes), its sizes in each family's entry: asv's ``rounds`` (a fresh process each) and ``repeat`` (min, max
    samples, max seconds) of time_ figures, the speedup's interleaved rounds and its block pairs (`Case.block`)."""

    name: str
    rounds: int
    repeat: tuple[int, int, float]
    speedup_rounds: int
    speedup_blocks: int = 5


GRIDS = {
    # Quick: up to 1 s of samples a case (5 to 20; it was 2 s until the main job had to fit 10 minutes).
    "quick": Grid(name="quick", rounds=1, repeat=(5, 20, 1.0), speedup_rounds=10),
    "full": Grid(name="full", rounds=2, repeat=(5, 20, 10.0), speedup_rounds=20),
}


def grid(environ: Mapping[str, str] | None = None) -> Grid:
    """The grid ``PITFALLS_GRID`` selects ("quick" when unset); ``PITFALLS_ROUNDS`` overrides its asv ``rounds``
    (scripts/compare sets 2, so that asv interleaves two commits' rounds and machine drift cannot pass for a
    change)."""
    name, rounds = chosen_grid(os.environ if environ is None else environ)
    return GRIDS[name] if rounds is None else dataclasses.replace(GRIDS[name], rounds=rounds)


GRID = grid()


def skip(reason: str) -> None:
    """Skip the current benchmark from ``setup()``: asv records it as n/a and prints the reason."""
    raise NotImplementedError(reason)


@contextlib.contextmanager
def skipping() -> Iterator[None]:
    """A case that cannot run here (`SkipCase`: no such device, too big, a compiler crash) becomes a skip with its
    reason; any other error fails the benchmark as it should."""
    try:
        yield
    except SkipCase as error:
        skip(error.reason)


def figure(value: T | Unavailable) -> T:
    """A measured value, or skip this one benchmark method (n/a, the reason in its output) when it is unavailable."""
    if isinstance(value, Unavailable):
        print(f"pitfalls: n/a: {value.reason}", file=sys.stderr)
        raise SkipNotImplemented(value.reason)
    return value


def require_cuda() -> None:
    """Skip unless CUDA can be used in this process (checked in the forked child, never at import)."""
    if not cuda_available():
        skip("no CUDA device")


def speedup(baseline: Case, candidate: Case, *, calls: int = 1) -> float:
    """The speedup by `measure.speedup`, with the grid's rounds and blocks."""
    return measure.speedup(baseline, candidate, rounds=GRID.speedup_rounds, blocks=GRID.speedup_blocks,
                           calls=calls).ratio


SERIES_VERSIONS = {name: pin["version"] for name, pin in
                   json.loads((Path(__file__).parent / "series.json").read_text()).items()}
_FIGURE_PREFIXES = ("time_", "peakmem_", "mem_", "track_")


class Benchmark:
    """A benchmark class of the suite: each of its figures takes its unit from ``units`` and its asv version from
    benchmarks/series.json ("{unit}" in a unit is what one call of the family is: step, call, batch)."""

    units: dict[str, str] = {}
    unit_of_call = "call"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not getattr(cls, "measures", lambda: True)():
            return
        where = f"{cls.__module__.rpartition('.')[2]}.{cls.__name__}."
        for name in [n for n in dir(cls) if n.startswith(_FIGURE_PREFIXES)]:
            method = getattr(cls, name)
            if cls.__dict__.get(name) is not method or method.__qualname__ != f"{cls.__qualname__}.{name}":
                # Inherited, or one function given to several classes: this class gets its own copy, to carry its
                # own unit and version.
                method = type(method)(method.__code__, method.__globals__, name, method.__defaults__,
                                      method.__closure__)
                method.__qualname__ = f"{cls.__qualname__}.{name}"
                setattr(cls, name, method)
            if name in cls.units:
                method.unit = cls.units[name].format(unit=cls.unit_of_call)
            if where + name in SERIES_VERSIONS:
                method.version = SERIES_VERSIONS[where + name]



class FamilyBenchmark(Benchmark, abc.ABC):
    """A benchmark class of one family: its axes are the variants and the floor, the grid's parameters (less the
    one a compile class sweeps inside one process), the devices and, where the family compiles, the mode; then its
    ``extra_axes``, axes of its own (name -> values). Abstract until a subclass names its ``family``: asv passes
    over abstract classes, so the shapes below are no benchmarks of this module."""

    @property
    @abc.abstractmethod
    def family(self) -> str:
        """The registered family the class measures."""

    @classmethod
    def measures(cls) -> bool:
        """Whether the class is one asv collects (it names its family), rather than a shape of several."""
        return isinstance(cls.family, str)

    device_axis = True
    mode_axis = True
    sweep_axis: str | None = None
    extra_axes: dict[str, list[Any]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        if isinstance(cls.family, str):
            entry = registry.family(cls.family)
            cls.unit_of_call = entry.unit
            sizes = {name: list(values) for name, values in entry.axes(GRID.name).items() if name != cls.sweep_axis}
            axes = {"variant": list(entry.cases), **sizes}
            if cls.device_axis:
                axes["device"] = list(DEVICES)
            if cls.mode_axis and COMPILE in entry.figures:  # a family with nothing to compile has no compiled column
                axes["mode"] = list(measure.MODES)
            axes.update(cls.extra_axes)
            cls.param_names, cls.params = list(axes), list(axes.values())
        super().__init_subclass__(**kwargs)

    # Whether the class also reads the naive variant run eagerly (a figure against it: the speedup).
    with_naive = False

    def setup(self, *params: Any) -> None:
        self.case = self.build(params)
        if self.with_naive:
            self.naive_case = self.build(params, variant=registry.baseline(self.family), mode="eager")

    def arguments(self, params: tuple[Any, ...]) -> dict[str, Any]:
        """The parameters asv passed to setup, by name."""
        return dict(zip(self.param_names, params, strict=True))  # type: ignore[attr-defined]

    def build(self, params: tuple[Any, ...], **replaced: Any) -> Case:
        """The case of one parameter set, built once per process (`measure.case`); ``replaced`` overrides some
        parameters; a case that cannot run here skips."""
        args = {**self.arguments(params), **replaced}
        for extra in self.extra_axes:
            args.pop(extra)
        variant, device, mode = args.pop("variant"), args.pop("device", "cuda"), args.pop("mode", "eager")
        with skipping():
            return measure.case(self.family, variant, device, mode, **args)

"""The family protocol: everything the suite knows about one pitfall family travels in one `Family` entry.

A family is a job with several ways of doing it: the naive one an article starts from, the optimized ones it
ends with, and a floor (the same job as fast as the hardware allows; a reference, not a variant). Its entry
carries, as pyperf's metadata table carries a formatter and a check per key, what every consumer needs: typed
parameters with defaults and checks, a smoke size, the asv grids, a memory estimate, the case builder, the
equivalence comparer and which figures apply. The CLI, the asv suite, the tests, the equivalence gate and the
GPU proof loop over entries; none of them branches on a family's name.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from pitfalls._checks import check_choice
from pitfalls.devices import cuda_available, fits, resolve_device

if TYPE_CHECKING:  # the calibration table imports the probes, which import this module
    from pitfalls.known.table import Check

ParamValue = int | str | bool

# The reference case every family may add after its variants: the family's job done as fast as the hardware
# allows. The equivalence gate does not apply to it.
FLOOR = "floor"

# The figures a family can have; each is one shared benchmark class of the asv suite and one probe.
TIME = "time"  # time per call and host peak memory
SPEEDUP = "speedup"  # over the naive variant, interleaved in one process
HAZARDS = "hazards"  # sync hazards of the eager program (needs a single-process `fn`)
COMPILE = "compile"  # torch.compile seconds, graph breaks, recompiles (needs `fn` and `inputs`)
CUDA = "cuda"  # real host-device syncs and CUDA peak memory
NVML = "nvml"  # GPU busy, memory and power while the case loops
ALL_FIGURES = frozenset({TIME, SPEEDUP, HAZARDS, COMPILE, CUDA, NVML})


class SkipCase(Exception):
    """This case cannot run here (no such device, too big for memory); ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Case:
    """One workload, built once: a family's variant (or floor) with its parameters, device and compile choice.

    Calling it runs one unit of the family's work (a training step, a sampling call, a batch) queued on the
    device, not synchronized. ``fn(*inputs)`` is the eager form of the part ``torch.compile`` wraps, for probes
    that must see every op; a case with no such single-process part (a multi-process step) has ``fn=None``.
    ``close`` releases what the case holds beyond memory (worker processes), when it holds any; ``with case:``
    calls it on the way out.

    ``block``, for a case whose calls involve worker processes, queues or ranks: ``block(calls)`` runs ``calls``
    calls at steady state (after discarding whatever the case could have made in advance) and returns the
    seconds per call, holding no busy worker when it returns, so that another case timed next is not racing this
    one's prefetching. Speedups and throughputs of such cases are taken from interleaved blocks
    (`pitfalls.probes.blocked_speedup`), never from alternating single calls with both cases live.
    """

    family: str
    variant: str
    device: torch.device
    compiled: bool
    params: Mapping[str, Any]
    call: Callable[[], Any] = field(repr=False)
    fn: Callable[..., Any] | None = field(default=None, repr=False)
    inputs: tuple[Any, ...] = field(default=(), repr=False)
    close: Callable[[], None] | None = field(default=None, repr=False)
    block: Callable[[int], float] | None = field(default=None, repr=False)

    def __call__(self) -> Any:
        return self.call()

    def __enter__(self) -> Case:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.close is not None:
            self.close()

    @property
    def name(self) -> str:
        mode = "compiled" if self.compiled else "eager"
        sizes = " ".join(f"{k}={v}" for k, v in self.params.items())
        return f"{self.family}/{self.variant} {sizes} {self.device} {mode}"


@dataclass(frozen=True)
class Comparison:
    """One variant on one device against its family's naive variant.

    ``skipped`` holds why the comparison could not be made on this machine (a variant that needs two GPUs): such a
    row neither passes nor fails the gate, and `matches` is False only because nothing was shown to match.
    ``stand_in`` records which path ran when it was not the variant's own: what stood in for the part that could
    not run here (gpu_decode's device decoder without CUDA). A stand-in never passes: such a row either fails or
    is not run.
    """

    family: str
    variant: str
    device: str
    matches: bool
    max_abs_diff: float
    detail: str = ""
    skipped: str = ""
    stand_in: str = ""

    def __post_init__(self) -> None:
        if self.matches and (self.stand_in or self.skipped):
            raise ValueError(f"{self.family}/{self.variant} on {self.device}: a row whose own code path did not "
                             f"run cannot pass (stand-in: {self.stand_in or '-'}; not run: {self.skipped or '-'})")

    @classmethod
    def not_run(cls, family: str, variant: str, device: str, reason: str, stand_in: str = "") -> Comparison:
        """A comparison this machine cannot make, and why (with the stand-in that ran instead, if one did)."""
        return cls(family, variant, device, False, float("nan"), skipped=reason, stand_in=stand_in)


_BOOL_TEXT = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


@dataclass(frozen=True)
class Param:
    """One typed parameter of a family's cases: its default, what it allows, and how the CLI spells it.

    Args:
        name: the keyword the builder takes (``image_size``); the CLI flag is ``--image-size``.
        default: the value when none is given; None means derived from the others by the builder (say how in
            ``help``), and then ``kind`` must be given.
        help: one line for ``--help``.
        choices: the allowed values, when they are a closed set.
        minimum: the smallest allowed int (ints only).
        kind: int, str or bool; taken from the default when omitted.
    """

    name: str
    default: ParamValue | None
    help: str
    choices: tuple[ParamValue, ...] = ()
    minimum: int = 1
    kind: type | None = None

    def __post_init__(self) -> None:
        kind = self.kind if self.kind is not None else type(self.default)
        if kind not in (int, str, bool):
            raise TypeError(f"parameter {self.name!r}: kind must be int, str or bool, got {kind.__name__}")
        object.__setattr__(self, "kind", kind)
        if self.default is not None:
            self.check(self.default)

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def type_name(self) -> str:
        assert self.kind is not None  # set in __post_init__
        return self.kind.__name__

    def check(self, value: Any) -> ParamValue | None:
        """Return ``value`` if this parameter allows it, else raise naming the parameter and what it allows."""
        if value is None and self.default is None:
            return None
        kind = self.kind
        assert kind is not None  # set in __post_init__
        if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
            raise TypeError(f"{self.name} must be an int, got {value!r} ({type(value).__name__})")
        if kind is not int and not isinstance(value, kind):
            raise TypeError(f"{self.name} must be a {kind.__name__}, got {value!r} ({type(value).__name__})")
        if self.choices:
            if value not in self.choices:
                allowed = ", ".join(str(c) for c in self.choices)
                raise ValueError(f"{self.name}={value!r} is not allowed; allowed: {allowed}")
        elif kind is int and value < self.minimum:
            raise ValueError(f"{self.name}={value!r} is not allowed; {self.name} must be an int >= {self.minimum}")
        return value

    def parse(self, text: str) -> ParamValue | None:
        """Turn command-line text into a checked value."""
        value: Any = text
        if self.kind is int:
            try:
                value = int(text)
            except ValueError:
                raise ValueError(f"{self.name}={text!r} is not an int") from None
        elif self.kind is bool:
            if text.lower() not in _BOOL_TEXT:
                raise ValueError(f"{self.name}={text!r} is not a boolean; allowed: true, false")
            value = _BOOL_TEXT[text.lower()]
        return self.check(value)


# A figure of a family's own (name, value or an `Unavailable` with the reason, unit, note), as `pitfalls probe`
# shows it beside the shared ones.
OwnFigure = tuple[str, Any, str, str]
Builder = Callable[[str, torch.device, bool, dict[str, Any]], Case]
Estimator = Callable[[Mapping[str, Any]], int]
Comparer = Callable[["Family", str, torch.device], Comparison]


@dataclass(frozen=True)
class Family:
    """A pitfall family: its variants (naive first), its parameters and everything built from them.

    Attributes:
        name: the family's name, e.g. "loss".
        article: the source article's number ("000").
        summary: one line: what the pitfall is.
        variants: the variants, the naive one first.
        params: the typed parameters of a case, with defaults.
        builder: ``builder(variant, device, compiled, params) -> Case`` with every parameter present and checked;
            `Family.build` does the checks, device and memory guard first. It also builds `FLOOR` if ``floor``.
        estimate: peak bytes of a case from its parameters, before anything is allocated.
        comparer: ``comparer(family, variant, device) -> Comparison`` against the naive variant.
        smoke: parameters small enough for `pitfalls check`, the tests and local A/B runs.
        grids: grid name ("quick", "full") -> parameter -> values swept by the asv suite; every grid has the same
            parameters, in the order of the benchmarks' axes.
        article_sizes: the sizes of the article's headline figures: the budgeted GPU run measures them there, and
            the claims table gives a verdict only at them (the one place they are written).
        figures: which figures apply (see `ALL_FIGURES`).
        compile_sweep: the parameter the compile benchmark sweeps inside one process to count recompiles.
        unit: what one call of a case is ("step", "call", "batch"), for units such as hazards/step.
        floor: whether the family has a floor case.
        own_figures: the family's own figures of a built case (bytes per batch, per-rank memory...), for
            ``pitfalls probe``; its asv module benchmarks the same figures.
        calibrations: the known-answer checks of the family's own instruments (`pitfalls.calibration.Check`),
            run by ``pitfalls calibrate`` beside the shared ones; a figure no check names reads "uncalibrated".
        benchmark_figures: asv method name (``track_...``) -> the name ``own_figures`` gives the figure it
            publishes, for the methods that publish one a check calibrates: the report marks them calibrated.
    """

    name: str
    article: str
    summary: str
    variants: tuple[str, ...]
    params: tuple[Param, ...]
    builder: Builder = field(repr=False)
    estimate: Estimator = field(repr=False)
    comparer: Comparer = field(repr=False)
    smoke: Mapping[str, Any]
    grids: Mapping[str, Mapping[str, tuple[Any, ...]]]
    article_sizes: tuple[Mapping[str, Any], ...] = ()
    figures: frozenset[str] = ALL_FIGURES
    compile_sweep: str | None = None
    unit: str = "call"
    floor: bool = True
    own_figures: Callable[[Case], list[OwnFigure]] | None = field(default=None, repr=False)
    calibrations: tuple[Check, ...] = field(default=(), repr=False)
    benchmark_figures: Mapping[str, str] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z][a-z0-9_]*", self.name):
            raise ValueError(
                f"family name {self.name!r} must be lower-case letters, digits and _, starting with a letter "
                "(it names CLI subcommands and asv classes)"
            )
        if len(self.variants) < 2 or len(set(self.variants)) != len(self.variants) or FLOOR in self.variants:
            raise ValueError(
                f"family {self.name!r}: variants must be two or more distinct names, naive first, "
                f"not {FLOOR!r}; got {self.variants}"
            )
        unknown = set(self.figures) - ALL_FIGURES
        if unknown:
            raise ValueError(f"family {self.name!r}: unknown figures {sorted(unknown)}; allowed: {sorted(ALL_FIGURES)}")
        axes = {name: tuple(grid) for name, grid in self.grids.items()}
        if "quick" not in axes or len(set(axes.values())) != 1:
            raise ValueError(f"family {self.name!r}: grids must include 'quick' and sweep the same parameters: {axes}")
        for sizes in (self.smoke, *self.article_sizes):
            self.resolve(sizes)
        for grid in self.grids.values():
            for name, values in grid.items():
                for value in values:
                    self.param(name).check(value)
        if self.compile_sweep is not None and self.compile_sweep not in axes["quick"]:
            raise ValueError(f"family {self.name!r}: compile_sweep {self.compile_sweep!r} is not a grid axis")

    @property
    def baseline(self) -> str:
        """The naive variant, the one every other is compared with."""
        return self.variants[0]

    @property
    def cases(self) -> tuple[str, ...]:
        """What the suite builds and measures: the variants, then the floor."""
        return (*self.variants, FLOOR) if self.floor else self.variants

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    def axes(self, grid: str) -> dict[str, tuple[ParamValue, ...]]:
        """The parameters a grid sweeps and their values, in axis order."""
        if grid not in self.grids:
            raise ValueError(f"grid={grid!r} is not a grid of {self.name}; allowed: {', '.join(self.grids)}")
        return dict(self.grids[grid])

    def param(self, name: str) -> Param:
        for param in self.params:
            if param.name == name:
                return param
        raise ValueError(f"{self.name} has no parameter {name}; allowed: {', '.join(self.param_names)}")

    def resolve(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """Every parameter of a case: the given ones checked, the others at their defaults."""
        unknown = sorted(set(params) - set(self.param_names))
        if unknown:
            raise ValueError(
                f"{self.name} has no parameter {', '.join(unknown)}; allowed: {', '.join(self.param_names)}"
            )
        return {p.name: p.check(params[p.name]) if p.name in params else p.default for p in self.params}

    def check_case(self, variant: str) -> str:
        """Return ``variant`` if it is a variant or the floor, else raise ValueError listing them."""
        return check_choice(f"{self.name} variant", variant, self.cases)

    def estimate_bytes(self, params: Mapping[str, Any]) -> int:
        """Estimate the peak bytes of a case from its parameters, before anything is allocated."""
        return self.estimate(self.resolve(params))

    def place(self, variant: str, device: str | torch.device, params: Mapping[str, Any]) -> tuple[torch.device, dict]:
        """Check a case's variant and parameters and find its device: what every way of building one starts with.

        Returns:
            The device and every parameter (the given ones checked, the others at their defaults).

        Raises:
            ValueError, TypeError: an unknown variant or parameter, or a value the parameter does not allow.
            SkipCase: the device is absent.
        """
        self.check_case(variant)
        resolved = self.resolve(params)
        if str(device).startswith("cuda") and not cuda_available():
            raise SkipCase("no CUDA device")
        return resolve_device(device), resolved

    def build(self, variant: str, *, device: str = "cpu", compiled: bool = False, **params: Any) -> Case:
        """Build one case on seeded inputs.

        Args:
            variant: one of the family's variants, or `FLOOR`.
            device: ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
            compiled: wrap the workload in ``torch.compile`` (compiled lazily, on the first call); only for
                families whose figures include `COMPILE`.
            **params: the family's parameters; missing ones take their defaults.

        Returns:
            The case, ready to call.

        Raises:
            ValueError, TypeError: an unknown variant or parameter, or a value the parameter does not allow.
            SkipCase: the device is absent or the case would not fit in its memory.
        """
        if compiled and COMPILE not in self.figures:
            raise ValueError(f"compiled=True is not allowed: the {self.name} family has nothing to torch.compile")
        where, resolved = self.place(variant, device, params)
        ok, reason = fits(where, self.estimate(resolved))
        if not ok:
            raise SkipCase(reason)
        return self.builder(variant, where, bool(compiled), resolved)

    def compare(self, variant: str, device: str | torch.device = "cpu") -> Comparison:
        """Compare one variant with the naive variant on small inputs (the equivalence gate)."""
        check_choice(f"{self.name} variant", variant, self.variants)
        return self.comparer(self, variant, resolve_device(device))

"""`probe_case` on stand-in and real cases, and the table it renders."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from fakes import FakeClock, FakeNVML, NVMLError_LibraryNotFound
from rich.console import Console

from pitfalls.probes import figures as report
from pitfalls.probes import timing
from pitfalls.probes._cuda import cuda_unavailable_reason
from pitfalls.probes.figures import ProbeFigure, probe_case, render
from pitfalls.result import Unavailable

FAST = {"rounds": 2, "min_run_time": 0.01, "nvml_seconds": 0.01}


@dataclass
class StandIn:
    """The attributes of pitfalls.cases.Case that the probes use."""

    fn: Callable[[], Any]
    variant: str = "naive"
    family: str = "toy"
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    compiled: bool = False
    params: dict[str, int] = field(default_factory=dict)

    def __call__(self) -> Any:
        return self.fn()


X = torch.randn(512)


def with_nonzero() -> torch.Tensor:
    return torch.nonzero(X > 0).sum()


def without_hazard() -> torch.Tensor:
    return torch.where(X > 0, X, 0.0).sum()


def by_name(figures: list[ProbeFigure]) -> dict[str, ProbeFigure]:
    return {f.name: f for f in figures}


def text(figures: list[ProbeFigure]) -> str:
    console = Console(width=200, record=True)
    console.print(render(figures))
    return console.export_text()


@dataclass
class BlockedStandIn(StandIn):
    """A case with workers, queues or ranks: ``block(calls)`` gives its steady-state seconds per call."""

    seconds: float = 0.0
    blocks: list[int] = field(default_factory=list)

    def block(self, calls: int) -> float:
        self.blocks.append(calls)
        return self.seconds


def test_a_case_with_workers_or_ranks_is_timed_and_compared_by_its_own_blocks() -> None:
    # The asv suite's routine: a call from here would time a ddp control round trip, or batches a loader's workers
    # made in advance; interleaved calls would let the idle case prefetch while the other is timed.
    case = BlockedStandIn(without_hazard, variant="ram_decoded", family="loader", seconds=0.010)
    other = BlockedStandIn(without_hazard, variant="naive", family="loader", seconds=0.025)
    figures = by_name(probe_case(case, baseline_case=other, nvml=FakeNVML(), **FAST))
    assert figures["time per call"].value == pytest.approx(10.0)
    assert "steady-state blocks" in figures["time per call"].note
    assert figures["speedup over naive"].value == pytest.approx(2.5)
    assert "block pairs, one live" in figures["speedup over naive"].note
    assert len(other.blocks) >= 5 and set(other.blocks) == {1}


def test_an_eager_cpu_case_gets_every_figure_and_reasons_for_the_gpu_ones(monkeypatch) -> None:
    # Both timing probes read one fake clock; a naive call costs it 3 units, a static call 1 (powers of two).
    clock, unit = FakeClock(), 2.0**-10
    monkeypatch.setattr(report, "wall_time", functools.partial(timing.wall_time, clock=clock))
    monkeypatch.setattr(timing, "interleaved_speedup", functools.partial(timing.interleaved_speedup, clock=clock))

    def naive() -> torch.Tensor:
        clock.advance(3 * unit)
        return with_nonzero()

    def static() -> torch.Tensor:
        clock.advance(unit)
        return without_hazard()

    case = StandIn(naive, variant="naive")
    other = StandIn(static, variant="static")
    figures = by_name(probe_case(case, baseline_case=other, nvml=FakeNVML(), **FAST))

    assert figures["time per call"].value == pytest.approx(3 * unit * 1e3) and figures["time per call"].unit == "ms"
    assert figures["speedup over static"].value == pytest.approx(1 / 3)  # static time / this time
    assert figures["sync hazards per call"].value == 1
    assert figures["  aten.nonzero.default"].value == 1
    assert "first call (compile + one run)" not in figures  # eager: no compile figures
    reason = cuda_unavailable_reason() or "case runs on cpu"
    for name in ("time per call (CUDA events)", "host-device syncs per call", "CUDA max memory allocated"):
        assert figures[name].value == Unavailable(reason), name
    # NVML works (the fake), so what stops the NVML figures is the case's device.
    for name in ("GPU busy (NVML utilization, sampled)", "GPU power (NVML)"):
        assert figures[name].value == Unavailable("case runs on cpu"), name


def test_nvml_figures_of_a_cpu_case_name_what_stops_nvml() -> None:
    case = StandIn(without_hazard, variant="naive")
    nvml = FakeNVML(init_error=NVMLError_LibraryNotFound())
    figures = by_name(probe_case(case, baseline_case=case, nvml=nvml, **FAST))
    assert figures["GPU power (NVML)"].value == Unavailable("NVML library not found")


def test_the_baseline_against_itself_says_so() -> None:
    case = StandIn(without_hazard, variant="naive")
    figures = by_name(probe_case(case, baseline_case=case, nvml=FakeNVML(), **FAST))
    assert "shows the noise" in figures["speedup over naive"].note
    assert figures["sync hazards per call"].value == 0
    assert not any(name.startswith("  aten") for name in figures)


def test_a_compiled_case_reports_its_first_call_and_graph_breaks() -> None:
    compiled = torch.compile(with_nonzero, backend="eager")
    case = StandIn(compiled, variant="naive", compiled=True)
    figures = probe_case(case, baseline_case=case, nvml=FakeNVML(), **FAST)
    assert [f.name for f in figures[:3]] == ["first call (compile + one run)", "graphs compiled", "graph breaks"]
    named = by_name(figures)
    assert named["graph breaks"].value == 1
    assert "Dynamic shape operator [aten.nonzero.default] x1" in named["graph breaks"].note
    assert named["graphs compiled"].value == 2
    assert named["sync hazards per call"].value == 1
    assert "compiled code runs eagerly while counted" in named["sync hazards per call"].note


def test_a_trace_is_written_when_asked(tmp_path) -> None:
    path = tmp_path / "case.json"
    figures = by_name(probe_case(StandIn(with_nonzero), baseline_case=StandIn(with_nonzero), nvml=FakeNVML(),
                                 trace_path=path, **FAST))
    assert figures["trace"].value == str(path)
    assert path.is_file()


def test_nvml_figures_of_a_cuda_case_come_from_the_sampler() -> None:
    # Only the mapping from the sampler's summary to figures is exercised: the "CUDA" case runs Python only.
    case = StandIn(lambda: None, device=torch.device("cuda", 0))
    figures = by_name(report._nvml_figures(case, 0.01, FakeNVML(utilization=[40.0], power_mw=200_000),
                                           lambda: None))
    assert figures["GPU busy (NVML utilization, sampled)"].value == 40.0
    assert figures["GPU power (NVML)"].value == 200.0
    assert figures["GPU busy (NVML driver samples)"].value == Unavailable("no driver utilization samples in the window")

    missing = by_name(report._nvml_figures(case, 0.01, FakeNVML(init_error=NVMLError_LibraryNotFound(12)),
                                           lambda: None))
    assert {f.value for f in missing.values()} == {Unavailable("NVML library not found")}


def test_render_writes_values_units_and_reasons() -> None:
    out = text([
        ProbeFigure("time per call", 12.345678, "ms", "median"),
        ProbeFigure("sync hazards per call", 4, "ops"),
        ProbeFigure("GPU power (NVML)", Unavailable("NVML library not found"), "W"),
    ])
    assert "12.35" in out and "ms" in out and "median" in out
    assert "unavailable: NVML library not found" in out
    lines = [line for line in out.splitlines() if "sync hazards per call" in line]
    assert len(lines) == 1 and " 4 " in lines[0]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"rounds": 0}, "rounds must be an int > 0, got 0"),
    ({"min_run_time": -1}, "min_run_time must be a number > 0, got -1"),
    ({"nvml_seconds": "1"}, "nvml_seconds must be a number > 0, got '1'"),
])
def test_bad_arguments_are_rejected(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        probe_case(StandIn(without_hazard), baseline_case=StandIn(without_hazard), **kwargs)


def test_something_that_is_not_a_case_is_rejected() -> None:
    with pytest.raises(TypeError, match="case must be a pitfalls Case \\(it has no 'family'\\), got function"):
        probe_case(without_hazard, baseline_case=StandIn(without_hazard))  # type: ignore[arg-type]


def test_figures_that_do_not_apply_to_a_family_read_so_with_the_reason() -> None:
    from pitfalls.cases import build_case

    case = build_case("sampler", "static", n=1000)
    naive = build_case("sampler", "nonzero", n=1000)
    figures = by_name(probe_case(case, baseline_case=naive, applies=frozenset({"time", "speedup", "cuda"}),
                                 nvml=FakeNVML(), **FAST))
    assert "speedup over nonzero" in figures
    assert figures["sync hazards per call"].value == Unavailable("does not apply to the sampler family")
    assert not any(name.startswith("GPU busy") for name in figures)

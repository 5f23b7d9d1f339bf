"""Compile seconds: one definition of the figure, callable backends, and a known-answer row a planted fault fails."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from pitfalls.calibration import figure_checks as shared
from pitfalls.calibration.marks import instrument_of
from pitfalls.known.table import COMPILE_SECONDS, CPU, Check, verdict
from pitfalls.probes.compiled import CompileReport, compile_probe

ROW = f"compile: a backend that takes {shared.COMPILE_MS} ms"


def ones(n: int) -> tuple[torch.Tensor]:
    return (torch.ones(n),)


def tiny(x: torch.Tensor) -> torch.Tensor:
    return (x * 2).sum()


def compile_row() -> Check:
    (check,) = [c for c in shared.shared_checks() if c.name == ROW]
    return check


def test_compile_seconds_is_the_first_call_less_a_steady_call() -> None:
    # A clock read twice around each timed call: the first call takes 7 s of it, the two steady calls 1 s and 2 s.
    readings = iter([100.0, 107.0, 110.0, 111.0, 120.0, 122.0])
    report = compile_probe(tiny, ones, [16], backend="eager", steady_calls=2, clock=lambda: next(readings))
    assert (report.first_call_s, report.steady_s) == (7.0, 1.5)
    assert report.compile_s == 5.5


def test_a_callable_backend_compiles_the_graph_and_the_report_names_it() -> None:
    graphs: list[int] = []

    def counting_backend(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Callable[..., Any]:
        graphs.append(len(example_inputs))
        return gm.forward

    report = compile_probe(tiny, ones, [8], backend=counting_backend, steady_calls=1)
    assert graphs == [1]  # dynamo handed it one graph of one input, once
    assert (report.backend, report.graphs, report.graph_breaks) == ("counting_backend", 1, 0)


def test_a_callable_backend_without_a_name_is_named_by_its_type() -> None:
    class Passthrough:
        def __call__(self, gm: torch.fx.GraphModule, _example_inputs: list[torch.Tensor]) -> Callable[..., Any]:
            return gm.forward

    assert compile_probe(tiny, ones, [8], backend=Passthrough(), steady_calls=1).backend == "Passthrough"


def test_a_backend_neither_named_nor_callable_is_refused() -> None:
    with pytest.raises(TypeError, match="backend must be callable"):
        compile_probe(tiny, ones, [8], backend=3, steady_calls=1)  # type: ignore[arg-type]


def test_the_row_calibrates_the_published_compile_seconds() -> None:
    check = compile_row()
    assert check.instruments == (COMPILE_SECONDS,)
    assert instrument_of("loss", "track_compile_seconds") == COMPILE_SECONDS


def test_the_planted_backend_hands_back_the_graph_to_run_eagerly() -> None:
    report = compile_probe(tiny, ones, [8], backend=shared.planted_backend(0), steady_calls=1)
    assert report.backend == "spin_0ms" and report.graphs == 1


# That the row reads the planted compile time is tests/test_calibrate.py's (every CPU row of the command passes,
# in one run of the whole table); here, the fault it must catch.


def warm_call(report: CompileReport) -> float:
    """The fault: compile seconds read from a call after the compiling one, as the time_ benchmarks time a case
    warmed up in setup; the compile is in no call it times."""
    return report.steady_s


@pytest.mark.serial
def test_compile_seconds_read_from_a_warm_call_fail_the_row() -> None:
    row = verdict(compile_row(), shared.planted_compile(figure=warm_call)(CPU))
    assert row.verdict == "fail", row

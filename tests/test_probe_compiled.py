"""torch.compile probe: graph breaks and recompiles, with dynamo's eager backend (no code generation, fast)."""

from __future__ import annotations

import pytest
import torch

from pitfalls.probes import compiled
from pitfalls.probes.compiled import CompileReport, CompileWatch, GraphBreak, compile_probe, dynamic_note
from pitfalls.result import Unavailable


def ones(n: int) -> tuple[torch.Tensor]:
    # Deterministic inputs: a data-dependent branch must take the same side at every size.
    return (torch.ones(n),)


def with_nonzero(x: torch.Tensor) -> torch.Tensor:
    return torch.nonzero(x > 0).float().sum() + x.sum()


def with_item_branch(x: torch.Tensor) -> torch.Tensor:
    if x.sum().item() > 0:
        return x * 2
    return x - 1


def without_break(x: torch.Tensor) -> torch.Tensor:
    return torch.where(x > 0, x, 0.0).sin().sum()


def test_nonzero_breaks_the_graph_once_with_dynamos_reason() -> None:
    report = compile_probe(with_nonzero, ones, [16], backend="eager", steady_calls=1)
    assert report.graph_breaks == 1
    assert report.graphs == 2  # before the break, and the resumed rest
    assert report.breaks == (GraphBreak(reason="Dynamic shape operator", context="aten.nonzero.default", count=1),)


def test_item_driven_branch_breaks_the_graph() -> None:
    report = compile_probe(with_item_branch, ones, [16], backend="eager", steady_calls=1)
    assert report.graph_breaks == 1
    assert len(report.breaks) == 1
    assert "item()" in report.breaks[0].reason


def test_a_static_function_compiles_to_one_graph_without_breaks() -> None:
    # A clock read twice around each timed call: the first call takes 7 s of it, the two steady calls 1 s and 2 s.
    readings = iter([100.0, 107.0, 110.0, 111.0, 120.0, 122.0])
    report = compile_probe(
        without_break, ones, [16], backend="eager", steady_calls=2, clock=lambda: next(readings)
    )
    assert isinstance(report, CompileReport)
    assert (report.graphs, report.graph_breaks, report.breaks) == (1, 0, ())
    assert report.first_call_s == 7.0  # the compiling call alone
    assert report.steady_s == 1.5  # the median of the later calls, the first kept out
    assert next(readings, None) is None  # no other call was timed
    assert report.sweep_first_call_s == ()
    assert report.recompiled_graphs == 0


@pytest.mark.parametrize(("dynamic", "recompiled"), [(False, 3), (None, 1), (True, 0)])
def test_size_sweep_recompiles_as_the_dynamic_setting_says(dynamic, recompiled) -> None:
    report = compile_probe(without_break, ones, [8, 16, 32, 64], dynamic=dynamic, backend="eager", steady_calls=1)
    # False: one graph per new size; None: one recompile marks the size dynamic, later sizes reuse it; True:
    # symbolic from the start.
    assert report.recompiled_graphs == recompiled
    assert len(report.sweep_first_call_s) == 3
    assert report.dynamic is dynamic
    assert report.dynamic_note == dynamic_note(dynamic)
    assert report.sizes == (8, 16, 32, 64)
    if recompiled:
        assert any("size mismatch" in reason for reason in report.recompile_reasons)
    else:
        assert report.recompile_reasons == ()


def test_graph_breaks_recompile_every_segment() -> None:
    # With a break, a size change recompiles both the part before the break and the resumed part.
    report = compile_probe(with_nonzero, ones, [8, 16], dynamic=None, backend="eager", steady_calls=1)
    assert report.recompiled_graphs == 2


def test_each_probe_starts_from_a_fresh_dynamo_state() -> None:
    first = compile_probe(without_break, ones, [8], backend="eager", steady_calls=1)
    again = compile_probe(without_break, ones, [8], backend="eager", steady_calls=1)
    # Without the reset the second probe would reuse the first one's graph and report 0 graphs.
    assert (first.graphs, again.graphs) == (1, 1)


def test_the_report_states_the_dynamo_configuration() -> None:
    report = compile_probe(without_break, ones, [8], backend="eager", steady_calls=1)
    config = dict(report.config)
    assert config["automatic_dynamic_shapes"] is torch._dynamo.config.automatic_dynamic_shapes
    assert config["capture_dynamic_output_shape_ops"] is torch._dynamo.config.capture_dynamic_output_shape_ops


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"sizes": []}, ValueError, "sizes must be a non-empty sequence of sizes, got \\[\\]"),
    ({"sizes": "8"}, ValueError, "sizes must be a non-empty sequence of sizes, got '8'"),
    ({"steady_calls": 0}, ValueError, "steady_calls must be an int >= 1, got 0"),
    ({"dynamic": "auto"}, ValueError, "dynamic must be None, False or True, got 'auto'"),
    ({"make_inputs": None}, TypeError, "make_inputs must be callable, got NoneType"),
])
def test_bad_arguments_are_rejected(kwargs, error, message) -> None:
    args = {"fn": without_break, "make_inputs": ones, "sizes": [8], **kwargs}
    with pytest.raises(error, match=message):
        compile_probe(**args)


@pytest.mark.slow
def test_inductor_compiles_the_static_function_into_one_graph() -> None:
    report = compile_probe(without_break, ones, [64, 128], backend="inductor", steady_calls=2)
    assert (report.backend, report.graphs, report.graph_breaks) == ("inductor", 1, 0)
    assert report.recompiled_graphs == 1  # dynamic=None: the second size recompiles once, as dynamic


def test_first_call_times_the_compiling_call_from_a_fresh_state() -> None:
    from fakes import FakeClock

    from pitfalls.probes.compiled import FirstCall, first_call

    clock = FakeClock()
    compiled = torch.compile(with_nonzero, backend="eager")
    x = torch.ones(8)
    compiled(x)  # compiled once already: first_call must reset, so its call compiles again

    def call() -> None:
        compiled(x)
        clock.advance(2.5)

    result = first_call(call, clock=clock)
    assert result == FirstCall(
        seconds=2.5,
        graphs=2,
        graph_breaks=1,
        breaks=(GraphBreak(reason="Dynamic shape operator", context="aten.nonzero.default", count=1),),
    )


def with_planted_break(x: torch.Tensor) -> torch.Tensor:
    y = x * 2.0
    torch._dynamo.graph_break()  # the planted break
    return y + 1.0


def test_the_watch_reads_each_break_at_its_line_and_recompiles_by_function() -> None:
    compiled.reset_dynamo()
    fn = torch.compile(with_planted_break, backend="eager")
    with CompileWatch() as watch:
        fn(torch.ones(8))
        fn(torch.ones(4))  # a second size: the function, and its frame resumed after the break, compile again
    (site,) = watch.graph_breaks
    lines = open(__file__).read().splitlines()
    assert lines[site.line - 1].strip() == "torch._dynamo.graph_break()  # the planted break"
    assert site.path == __file__ and "graph_break()" in site.reason
    assert [r.function for r in watch.recompiles] == ["with_planted_break", "with_planted_break"]
    assert all("size mismatch" in r.reason and r.seconds > 0 for r in watch.recompiles)
    assert watch.graphs == 4 and watch.compile_s > 0
    assert [b.count for b in watch.break_reasons] == [2]  # one break, met by the first compile and the recompile


def test_the_watch_says_why_when_torch_keeps_no_record(monkeypatch) -> None:
    monkeypatch.setattr(compiled, "_metrics", lambda: Unavailable("torch 0.0 keeps no compilation metrics"))
    with CompileWatch() as watch:
        pass
    assert isinstance(watch.recompiles, Unavailable) and isinstance(watch.compile_s, Unavailable)
    with CompileWatch(lines=False) as quiet:
        pass
    assert isinstance(quiet.graph_breaks, Unavailable)

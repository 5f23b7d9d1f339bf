"""torch.compile behaviour of one function: compile time, steady-state time, graph breaks, recompiles.

Figures come from dynamo's own counters (`torch._dynamo.utils.counters`): `stats.unique_graphs` (graphs
compiled), `graph_break` (reason -> events), and `torch._dynamo.utils.guard_failures` (why a cached graph was not
reused). Dynamo's state is reset before each probe, so the figures belong to the probed function alone.

Graph breaks are counted as `torch._dynamo.explain` counts them: graphs compiled by one call, minus one. The
`graph_break` counter is not used for the count because dynamo can report one break several times (it restarts
a frame's analysis after a break; the naive loss shows 7 break events for 6 graphs); it only supplies reasons.

What `dynamic=` means (torch 2.11-2.14): None (the default) compiles the first call for its exact sizes; when a
size changes, dynamo recompiles once with that dimension symbolic ("automatic dynamic"), and later sizes reuse
that graph. False compiles every new size anew, up to the recompile limit. True makes sizes symbolic from the
first compile.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from pitfalls._checks import check_callable

__all__ = [
    "CompileReport",
    "FirstCall",
    "GraphBreak",
    "compile_failure_reason",
    "compile_probe",
    "dynamic_note",
    "first_call",
    "reset_dynamo",
]

_DYNAMIC_NOTES = {
    None: "dynamic=None (default): first compile is for the exact sizes; a changed size recompiles once "
          "with that dimension dynamic, later sizes reuse it",
    False: "dynamic=False: every new size compiles a new graph, up to the recompile limit",
    True: "dynamic=True: sizes are symbolic from the first compile",
}


def compile_failure_reason(error: BaseException) -> str:
    """One line saying why torch.compile failed: the torch version, the backend and the backend's own error.

    A backend crash (``BackendCompilerFailed``) is a fact about that torch build, not a slow case: the suite
    records it as a figure that cannot be measured, with this line as the reason.
    """
    inner = getattr(error, "inner_exception", None) or error
    message = (str(inner).strip().splitlines() or [""])[0][:300]
    backend = getattr(error, "backend_name", "torch.compile")
    return f"torch.compile failed on torch {torch.__version__} ({backend}): {type(inner).__name__}: {message}"


def dynamic_note(dynamic: bool | None) -> str:
    """Describe in one line what a `torch.compile(dynamic=...)` setting does to a size sweep.

    Args:
        dynamic: the setting, None, False or True.

    Returns:
        The description.
    """
    if dynamic not in _DYNAMIC_NOTES:
        raise ValueError(f"dynamic must be None, False or True, got {dynamic!r}")
    return _DYNAMIC_NOTES[dynamic]


@dataclass(frozen=True)
class GraphBreak:
    """One distinct graph-break reason.

    Attributes:
        reason: the first line of dynamo's message, e.g. "Dynamic shape operator".
        context: dynamo's "Developer debug context" line when it gives one (e.g. "aten.nonzero.default"), else "".
        count: how many break events dynamo reported with this reason (restarts can repeat one break).
    """

    reason: str
    context: str
    count: int


@dataclass(frozen=True)
class CompileReport:
    """torch.compile figures for one function over a size sweep.

    Attributes:
        backend: the torch.compile backend: its name, or a callable backend's ``__name__``.
        dynamic: the `dynamic=` setting.
        dynamic_note: what that setting does, in words.
        config: the dynamo settings that shape the figures, as (name, value) pairs.
        sizes: the sweep, in call order; the first is the compiled and steady-state size.
        first_call_s: seconds of the first call: compilation plus one execution.
        steady_s: median seconds of a call at the first size once compiled.
        graphs: graphs compiled by the first call.
        graph_breaks: graphs - 1, as torch._dynamo.explain counts breaks (0 for one graph).
        breaks: the distinct graph-break reasons.
        sweep_first_call_s: seconds of the first call at each later size.
        recompiled_graphs: graphs compiled during the sweep after the first call (0: every size reused a graph).
        recompile_reasons: the distinct guard failures that caused them.
    """

    backend: str
    dynamic: bool | None
    dynamic_note: str
    config: tuple[tuple[str, Any], ...]
    sizes: tuple[Any, ...]
    first_call_s: float
    steady_s: float
    graphs: int
    graph_breaks: int
    breaks: tuple[GraphBreak, ...]
    sweep_first_call_s: tuple[float, ...]
    recompiled_graphs: int
    recompile_reasons: tuple[str, ...]

    @property
    def compile_s(self) -> float:
        """Seconds torch.compile took to compile: the first call less a steady call (the suite's compile seconds).

        The first call compiles and then runs the compiled code once; a steady call is that one run alone. Their
        difference is what compiling cost (dynamo's tracing, the backend's code generation), whatever the
        function's own run costs.
        """
        return self.first_call_s - self.steady_s


def _backend_name(backend: str | Callable[..., object]) -> str:
    """A backend as the report names it: a backend's name, or a callable backend's ``__name__``."""
    if isinstance(backend, str):
        return backend
    check_callable("backend", backend)
    return str(getattr(backend, "__name__", type(backend).__name__))


def _counters() -> Any:
    from torch._dynamo.utils import counters

    return counters


def _unique_graphs() -> int:
    return int(_counters()["stats"]["unique_graphs"])


def _break_reasons() -> tuple[GraphBreak, ...]:
    merged: dict[tuple[str, str], int] = {}
    for message, count in _counters()["graph_break"].items():
        lines = [line.strip() for line in str(message).splitlines() if line.strip()]
        reason = lines[0] if lines else str(message)
        context = next(
            (line.split(":", 1)[1].strip() for line in lines if line.startswith("Developer debug context:")), ""
        )
        merged[(reason, context)] = merged.get((reason, context), 0) + int(count)
    return tuple(GraphBreak(reason=r, context=c, count=n) for (r, c), n in sorted(merged.items()))


def _guard_failure_reasons() -> tuple[str, ...]:
    # A private table, present since torch 2.0; its absence must not break the probe, only empty the reasons.
    failures = getattr(torch._dynamo.utils, "guard_failures", {})
    seen: dict[str, None] = {}
    for reasons in failures.values():
        for reason in reasons:
            # "0/1: tensor 'x' size mismatch ..." -> drop the frame/entry id, keep the reason.
            text = str(reason).split(": ", 1)[1] if ": " in str(reason) else str(reason)
            seen.setdefault(text, None)
    return tuple(seen)


def _config() -> tuple[tuple[str, Any], ...]:
    cfg = torch._dynamo.config
    names = ("automatic_dynamic_shapes", "assume_static_by_default", "recompile_limit", "cache_size_limit",
             "capture_scalar_outputs", "capture_dynamic_output_shape_ops")
    return tuple((n, getattr(cfg, n)) for n in names if hasattr(cfg, n))


def _no_sync() -> None:
    return None


def reset_dynamo() -> None:
    """Forget every compiled graph and zero dynamo's counters, so the next figures belong to one case."""
    torch._dynamo.reset()
    _counters().clear()
    if hasattr(torch._dynamo.utils, "guard_failures"):
        torch._dynamo.utils.guard_failures.clear()


@dataclass(frozen=True)
class FirstCall:
    """The first call of a compiled callable, from a fresh dynamo state.

    Attributes:
        seconds: wall seconds of the call: compilation plus one execution.
        graphs: graphs compiled by it.
        graph_breaks: graphs - 1, as torch._dynamo.explain counts breaks (0 for one graph).
        breaks: the distinct graph-break reasons.
    """

    seconds: float
    graphs: int
    graph_breaks: int
    breaks: tuple[GraphBreak, ...]


def first_call(
    call: Callable[[], object],
    *,
    sync: Callable[[], object] = _no_sync,
    clock: Callable[[], float] = time.perf_counter,
) -> FirstCall:
    """Reset dynamo, then time the first call of an already torch.compile-wrapped callable and count its graphs.

    Args:
        call: a zero-argument callable that calls torch.compile'd code (compiled lazily on this first call).
        sync: called around the call, e.g. a CUDA synchronize.
        clock: seconds as a float.

    Returns:
        A `FirstCall`.
    """
    check_callable("call", call)
    reset_dynamo()
    sync()
    start = clock()
    call()
    sync()
    seconds = clock() - start
    graphs = _unique_graphs()
    return FirstCall(seconds=seconds, graphs=graphs, graph_breaks=max(graphs - 1, 0), breaks=_break_reasons())


def compile_probe(
    fn: Callable[..., object],
    make_inputs: Callable[[Any], Sequence[object]],
    sizes: Sequence[Any],
    *,
    dynamic: bool | None = None,
    backend: str | Callable[..., object] = "inductor",
    steady_calls: int = 5,
    sync: Callable[[], object] = _no_sync,
    clock: Callable[[], float] = time.perf_counter,
) -> CompileReport:
    """Compile `fn` afresh and measure compile time, steady-state time, graph breaks and recompiles.

    Args:
        fn: the eager function to compile.
        make_inputs: size -> the positional arguments for one call at that size.
        sizes: the sweep (non-empty); the first size is compiled, timed steady-state, and checked for breaks;
            each later size is called once to see whether it recompiles.
        dynamic: torch.compile's `dynamic=` (None, False or True).
        backend: torch.compile's backend: a name ("inductor"; "eager" or "aot_eager" to see dynamo's behaviour
            only) or a callable backend, ``backend(graph_module, example_inputs) -> callable``, as torch.compile
            accepts.
        steady_calls: calls at the first size, after the first, whose median is `steady_s` (>= 1).
        sync: called around each timed call, e.g. a CUDA synchronize.
        clock: seconds as a float.

    Returns:
        A `CompileReport`.
    """
    check_callable("fn", fn)
    check_callable("make_inputs", make_inputs)
    if isinstance(sizes, (str, bytes)) or not isinstance(sizes, Sequence) or len(sizes) == 0:
        raise ValueError(f"sizes must be a non-empty sequence of sizes, got {sizes!r}")
    if isinstance(steady_calls, bool) or not isinstance(steady_calls, int) or steady_calls < 1:
        raise ValueError(f"steady_calls must be an int >= 1, got {steady_calls!r}")
    note = dynamic_note(dynamic)
    name = _backend_name(backend)

    compiled = torch.compile(fn, backend=backend, dynamic=dynamic)

    def timed(inputs: Sequence[object]) -> float:
        sync()
        start = clock()
        compiled(*inputs)
        sync()
        return clock() - start

    first_inputs = tuple(make_inputs(sizes[0]))
    first = first_call(lambda: compiled(*first_inputs), sync=sync, clock=clock)
    steady_s = statistics.median(timed(first_inputs) for _ in range(steady_calls))

    sweep_times = tuple(timed(tuple(make_inputs(size))) for size in sizes[1:])
    return CompileReport(
        backend=name,
        dynamic=dynamic,
        dynamic_note=note,
        config=_config(),
        sizes=tuple(sizes),
        first_call_s=first.seconds,
        steady_s=steady_s,
        graphs=first.graphs,
        graph_breaks=first.graph_breaks,
        breaks=first.breaks,
        sweep_first_call_s=sweep_times,
        recompiled_graphs=_unique_graphs() - first.graphs,
        recompile_reasons=_guard_failure_reasons(),
    )

"""torch.compile, read from dynamo's own records: the one instrument of what was compiled, broken and recompiled.

`CompileWatch` is the instrument: over a block it reads the graphs compiled and the graph-break reasons from
dynamo's counters (`torch._dynamo.utils.counters`: `stats.unique_graphs`, `graph_break`), each graph break at
the user's line from dynamo's ``graph_breaks`` log (`torch._dynamo.symbolic_convert.graph_break_log`, whose records
name the file and line, "Graph break in user code at FILE:LINE", with dynamo's reason, explanation and hint), and
every frame compiled with its seconds and, for a recompile, the guard that failed, from dynamo's compilation
metrics (`torch._dynamo.utils.get_compilation_metrics`): recompiles by function. A frame dynamo resumes after a
break (``torch_dynamo_resume_in_f_at_N``) belongs to ``f``. `compile_probe` and `first_call` apply it to one
function; ``pitfalls doctor`` to a whole training script.

Graph breaks of one function are counted as `torch._dynamo.explain` counts them: graphs compiled by one call,
minus one. The `graph_break` counter is not used for the count because dynamo can report one break several times
(it restarts a frame's analysis after a break; the naive loss shows 7 break events for 6 graphs); it only supplies
reasons. For the same reason a break the log names again at the same line is one break.

What `dynamic=` means (torch 2.11-2.14) is `dynamic_note`'s to say.
"""

from __future__ import annotations

import logging
import re
import statistics
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from pitfalls._checks import check_callable
from pitfalls.probes.sites import is_user_file
from pitfalls.probes.timing import no_sync, timed_call
from pitfalls.result import Unavailable

__all__ = [
    "CompileReport",
    "CompileWatch",
    "FirstCall",
    "GraphBreak",
    "GraphBreakSite",
    "Recompile",
    "compile_failure_reason",
    "compile_probe",
    "dynamic_note",
    "first_call",
    "function_of",
    "reset_dynamo",
]

_AT = re.compile(r"in user code at (?P<path>.+):(?P<line>\d+)\nGraph Break Reason: (?P<reason>.*)", re.DOTALL)
_WRAPPER = "Encountered graph break when attempting to trace"
_RESUME = re.compile(r"torch_dynamo_resume_in_(?P<name>.+)_at_\d+$")
_FRAME_ID = re.compile(r"^\d+/\d+: ")

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


def _break_events() -> Counter[str]:
    return Counter({str(message): int(count) for message, count in _counters()["graph_break"].items()})


def _break_reasons(events: Counter[str]) -> tuple[GraphBreak, ...]:
    merged: dict[tuple[str, str], int] = {}
    for message, count in events.items():
        lines = [line.strip() for line in message.splitlines() if line.strip()]
        reason = lines[0] if lines else message
        context = next(
            (line.split(":", 1)[1].strip() for line in lines if line.startswith("Developer debug context:")), ""
        )
        merged[(reason, context)] = merged.get((reason, context), 0) + count
    return tuple(GraphBreak(reason=r, context=c, count=n) for (r, c), n in sorted(merged.items()))


def _config() -> tuple[tuple[str, Any], ...]:
    cfg = torch._dynamo.config
    names = ("automatic_dynamic_shapes", "assume_static_by_default", "recompile_limit", "cache_size_limit",
             "capture_scalar_outputs", "capture_dynamic_output_shape_ops")
    return tuple((n, getattr(cfg, n)) for n in names if hasattr(cfg, n))


def reset_dynamo() -> None:
    """Forget every compiled graph and zero dynamo's counters, so the next figures belong to one case."""
    torch._dynamo.reset()
    _counters().clear()


@dataclass(frozen=True)
class GraphBreakSite:
    """One graph break at one line of the user's code.

    Attributes:
        reason: dynamo's reason, its first informative line ("Call to `torch._dynamo.graph_break()`").
        path: the user's file.
        line: the line dynamo broke at.
        explanation: dynamo's explanation ("" when it gives none).
        hint: dynamo's hints, joined ("" when it gives none).
        events: how often dynamo logged it (a recompile or a restart meets it again).
    """

    reason: str
    path: str
    line: int
    explanation: str
    hint: str
    events: int


@dataclass(frozen=True)
class Recompile:
    """One frame compiled again: the function, the guard that failed, and when.

    Attributes:
        function: the user's function (a resumed frame is named after the function it resumes).
        path: its file.
        reason: the failed guard ("tensor 'x' size mismatch at index 0. expected 8, actual 4").
        started: wall time (`time.time()`) the compile started.
        seconds: the frame's compile seconds.
    """

    function: str
    path: str
    reason: str
    started: float
    seconds: float


def function_of(code_name: str) -> str:
    """The user's function a compiled frame belongs to: the frame's own name, or the function a resumed frame
    (``torch_dynamo_resume_in_f_at_12``) resumes."""
    match = _RESUME.match(code_name)
    return match["name"] if match else code_name


def _parse_reason(text: str) -> tuple[str, str, str]:
    """(reason, explanation, hint) from the text after "Graph Break Reason: "."""
    lines = [line.strip() for line in text.split("User code traceback:")[0].splitlines()]
    lines = [line for line in lines if line]
    if lines and lines[0].startswith(_WRAPPER) and len(lines) > 1:
        lines = lines[1:]
    reason = lines[0] if lines else text.strip()
    explanation = next((line.removeprefix("Explanation:").strip() for line in lines
                        if line.startswith("Explanation:")), "")
    hint = " ".join(line.removeprefix("Hint:").strip() for line in lines if line.startswith("Hint:"))
    return reason, explanation, hint


class _Collector(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.breaks: Counter[tuple[str, str, int]] = Counter()
        self.details: dict[tuple[str, str, int], tuple[str, str]] = {}

    def emit(self, record: logging.LogRecord) -> None:
        match = _AT.search(record.getMessage())
        if match is None:
            return
        reason, explanation, hint = _parse_reason(match["reason"])
        key = (reason, match["path"], int(match["line"]))
        self.breaks[key] += 1
        self.details.setdefault(key, (explanation, hint))


def _graph_break_log() -> logging.Logger | None:
    import torch._dynamo.symbolic_convert as convert

    log = getattr(convert, "graph_break_log", None)
    return log if isinstance(log, logging.Logger) else None


def _metrics() -> list[Any] | Unavailable:
    get = getattr(torch._dynamo.utils, "get_compilation_metrics", None)
    if get is None:
        return Unavailable(f"torch {torch.__version__} keeps no compilation metrics")
    return list(get())


class CompileWatch:
    """What torch.compile did while the block ran: graphs, graph breaks at their lines, recompiles, seconds.

    Args:
        lines: read each graph break's line from dynamo's ``graph_breaks`` log, kept quiet unless the user turned
            it on (``TORCH_LOGS=graph_breaks``); False leaves the log alone (a probe that needs the reasons only).
    """

    def __init__(self, lines: bool = True) -> None:
        self._lines = lines
        self._collector = _Collector()
        self._log: logging.Logger | None = None
        self._saved: tuple[int, bool] | None = None
        self._graphs_before = 0
        self._events_before: Counter[str] = Counter()
        self.started = 0.0
        self.ended: float | None = None

    def __enter__(self) -> CompileWatch:
        self.started = time.time()  # compilation metrics are stamped with it
        self._graphs_before = _unique_graphs()
        self._events_before = _break_events()
        log = self._log = _graph_break_log() if self._lines else None
        if log is not None:
            self._saved = (log.level, log.propagate)
            if not log.isEnabledFor(logging.DEBUG):  # not asked for by the user: collect it quietly
                log.setLevel(logging.DEBUG)
                log.propagate = False
            log.addHandler(self._collector)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.ended = time.time()
        if self._log is not None:
            self._log.removeHandler(self._collector)
            if self._saved is not None:
                self._log.setLevel(self._saved[0])
                self._log.propagate = self._saved[1]

    @property
    def graphs(self) -> int:
        """Graphs compiled inside the block (so far, while it runs)."""
        return _unique_graphs() - self._graphs_before

    @property
    def break_reasons(self) -> tuple[GraphBreak, ...]:
        """The distinct graph-break reasons dynamo counted inside the block."""
        return _break_reasons(_break_events() - self._events_before)

    @property
    def graph_breaks(self) -> tuple[GraphBreakSite, ...] | Unavailable:
        """The distinct graph breaks at their lines, the user's files only, in the order met."""
        if not self._lines:
            return Unavailable("this watch was asked for no lines")
        if self._log is None:
            return Unavailable(f"torch {torch.__version__} has no graph_breaks log to read")
        collector = self._collector
        return tuple(
            GraphBreakSite(reason, path, line, *collector.details[(reason, path, line)], events)
            for (reason, path, line), events in collector.breaks.items() if is_user_file(path)
        )

    def compiles(self) -> list[Any] | Unavailable:
        """The compilation metrics of the frames compiled inside the block."""
        metrics = _metrics()
        if isinstance(metrics, Unavailable):
            return metrics
        end = self.ended if self.ended is not None else time.time()
        return [m for m in metrics if self.started <= (getattr(m, "start_time", None) or 0.0) <= end]

    @property
    def compile_s(self) -> float | Unavailable:
        """Seconds spent compiling frames (dynamo and the backend) inside the block."""
        compiles = self.compiles()
        if isinstance(compiles, Unavailable):
            return compiles
        return sum(float(getattr(m, "entire_frame_compile_time_s", None) or 0.0) for m in compiles)

    @property
    def recompiles(self) -> tuple[Recompile, ...] | Unavailable:
        """Every frame compiled again inside the block, by function, with the guard that failed."""
        compiles = self.compiles()
        if isinstance(compiles, Unavailable):
            return compiles
        return tuple(
            Recompile(function_of(str(m.co_name)), str(m.co_filename), _FRAME_ID.sub("", str(m.recompile_reason)),
                      float(m.start_time), float(getattr(m, "entire_frame_compile_time_s", None) or 0.0))
            for m in compiles if getattr(m, "recompile_reason", None)
        )


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
    sync: Callable[[], object] = no_sync,
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
    with CompileWatch(lines=False) as watch:
        seconds = timed_call(call, sync=sync, clock=clock)
    graphs = watch.graphs
    return FirstCall(seconds=seconds, graphs=graphs, graph_breaks=max(graphs - 1, 0), breaks=watch.break_reasons)


def compile_probe(
    fn: Callable[..., object],
    make_inputs: Callable[[Any], Sequence[object]],
    sizes: Sequence[Any],
    *,
    dynamic: bool | None = None,
    backend: str | Callable[..., object] = "inductor",
    steady_calls: int = 5,
    sync: Callable[[], object] = no_sync,
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
    first_inputs = tuple(make_inputs(sizes[0]))
    first = first_call(lambda: compiled(*first_inputs), sync=sync, clock=clock)
    with CompileWatch(lines=False) as later:
        steady_s = statistics.median(timed_call(compiled, *first_inputs, sync=sync, clock=clock)
                                     for _ in range(steady_calls))
        sweep_times = tuple(timed_call(compiled, *make_inputs(size), sync=sync, clock=clock) for size in sizes[1:])
    recompiles = later.recompiles
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
        recompiled_graphs=later.graphs,
        recompile_reasons=() if isinstance(recompiles, Unavailable) else tuple(
            dict.fromkeys(r.reason for r in recompiles)),
    )

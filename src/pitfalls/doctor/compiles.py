"""torch.compile over a whole run: graph breaks at their lines with dynamo's reason and hint, recompiles with
their reasons, and the seconds spent compiling.

Graph breaks are read from dynamo's ``graph_breaks`` log (`torch._dynamo.symbolic_convert.graph_break_log`), whose
records name the user's file and line ("Graph break in user code at FILE:LINE") with the reason, the explanation and
a hint, and then the user's stack: a handler of the doctor's own collects them, the logger kept quiet unless the
user turned it on (``TORCH_LOGS=graph_breaks``). A break met again (a recompile, a resumed frame) is one break.
Recompiles and compile seconds come from dynamo's compilation metrics (`torch._dynamo.utils.
get_compilation_metrics`): one record per frame compiled, with the guard that failed when it was a recompile and
the frame's compile seconds (dynamo and the backend). A frame dynamo resumes after a break
(``torch_dynamo_resume_in_f_at_N``) belongs to ``f``.
"""

from __future__ import annotations

import logging
import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from pitfalls.probes.sites import is_user_file
from pitfalls.result import Unavailable

__all__ = ["CompileWatch", "GraphBreakSite", "Recompile", "function_of"]

_AT = re.compile(r"in user code at (?P<path>.+):(?P<line>\d+)\nGraph Break Reason: (?P<reason>.*)", re.DOTALL)
_WRAPPER = "Encountered graph break when attempting to trace"
_RESUME = re.compile(r"torch_dynamo_resume_in_(?P<name>.+)_at_\d+$")
_FRAME_ID = re.compile(r"^\d+/\d+: ")


@dataclass(frozen=True)
class GraphBreakSite:
    """One graph break at one line.

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
    """One frame compiled again: the guard that failed, and when.

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
    """Collect what torch.compile did while the block runs.

    Args:
        clock: wall time as `time.time()` gives it (compilation metrics are stamped with it).
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._collector = _Collector()
        self._log: logging.Logger | None = None
        self._saved: tuple[int, bool] | None = None
        self.started = 0.0
        self.ended: float | None = None

    def __enter__(self) -> CompileWatch:
        self.started = self._clock()
        log = self._log = _graph_break_log()
        if log is not None:
            self._saved = (log.level, log.propagate)
            if not log.isEnabledFor(logging.DEBUG):  # not asked for by the user: collect it quietly
                log.setLevel(logging.DEBUG)
                log.propagate = False
            log.addHandler(self._collector)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.ended = self._clock()
        if self._log is not None:
            self._log.removeHandler(self._collector)
            if self._saved is not None:
                self._log.setLevel(self._saved[0])
                self._log.propagate = self._saved[1]

    @property
    def graph_breaks(self) -> tuple[GraphBreakSite, ...] | Unavailable:
        """The distinct graph breaks, the user's files only, in the order met."""
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
        end = self.ended if self.ended is not None else self._clock()
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
        """Every frame compiled again inside the block, with the guard that failed."""
        compiles = self.compiles()
        if isinstance(compiles, Unavailable):
            return compiles
        return tuple(
            Recompile(function_of(str(m.co_name)), str(m.co_filename), _FRAME_ID.sub("", str(m.recompile_reason)),
                      float(m.start_time), float(getattr(m, "entire_frame_compile_time_s", None) or 0.0))
            for m in compiles if getattr(m, "recompile_reason", None)
        )

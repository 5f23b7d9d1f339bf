"""Where each sync hazard is written: the user's source line of every hazard a `SyncHazardCounter` sees.

A hazard's line is the innermost Python frame, at dispatch time, that lies outside torch and outside the suite's
measuring machinery (this package, the scan command, the test guard, the command line). The suite's family
modules count as user code, so a scan of a family's variant names lines of that family's module.

Backward ops run inside the autograd engine, where the Python stack shows only the `loss.backward()` call (or,
on CUDA, nothing: the engine runs them on its own thread). Their line is the forward line that built the
autograd node being run. That stack is recorded by autograd's anomaly mode: with
`torch.autograd.set_detect_anomaly(True, check_nan=False)` every node created keeps the Python stack of its
forward call in `node.metadata["traceback_"]`, and during backward `torch._C._current_autograd_node()` is the
node being run. torch 2.13's own `torch.utils._debug_mode.DebugMode(record_stack_trace=True)` reads forward
stacks the same way, and it is the only record of them torch keeps; `check_nan=False` matters, since the NaN
check would add an `isnan(...).any()` sync per node. Python code that runs during backward (a custom
`autograd.Function.backward`, a tensor hook) keeps its own line: a user frame met before the engine's entry
point wins over the forward stack.
"""

from __future__ import annotations

import contextlib
import inspect
import linecache
import os
import re
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from types import FrameType

import torch

from pitfalls.probes.syncs import HazardCounts, SyncHazardCounter
from pitfalls.rewrites import HazardKind, describe

__all__ = ["HazardLocator", "HazardSite", "LocatedHazards", "SourceLine", "is_user_file"]

_TORCH_DIR = os.path.dirname(os.path.realpath(torch.__file__)) + os.sep
_PACKAGE_DIR = Path(__file__).resolve().parents[1]
# The measuring machinery: its frames sit between the user's code and torch and are never the answer.
_MACHINERY_DIRS = (str(_PACKAGE_DIR / "probes") + os.sep,)
_MACHINERY_FILES = frozenset(
    str(_PACKAGE_DIR / name) for name in ("scan.py", "targets.py", "guard.py", "pytest_plugin.py", "cli.py")
)
# Anomaly mode stores frames as traceback.format_list() entries: '  File "x.py", line 3, in f\n    code\n'.
_FRAME_ENTRY = re.compile(r'\s*File "(?P<path>.+)", line (?P<lineno>\d+), in (?P<function>.+)')

_Key = tuple[str, int, str]  # path, line number, function


@lru_cache(maxsize=4096)
def is_user_file(filename: str) -> bool:
    """Say whether a code object's file is the user's (not torch, not the suite's measuring machinery).

    Args:
        filename: a frame's `co_filename`, or a path from a formatted traceback.

    Returns:
        True for the user's code, the suite's family modules included.
    """
    if filename.startswith("<"):
        return not filename.startswith("<frozen")
    path = os.path.realpath(filename)
    return not (path.startswith(_TORCH_DIR) or path.startswith(_MACHINERY_DIRS) or path in _MACHINERY_FILES)


@dataclass(frozen=True)
class SourceLine:
    """One line of the user's source.

    Attributes:
        path: the file, absolute where Python knows it so.
        lineno: the line number, from 1.
        function: the function the line is in.
        code: the line's text, stripped ("" when the file cannot be read).
    """

    path: str
    lineno: int
    function: str
    code: str

    @property
    def where(self) -> str:
        """`path:lineno`."""
        return f"{self.path}:{self.lineno}"

    def short_where(self, base: str | Path | None = None) -> str:
        """`path:lineno` with the path relative to `base` (default: the working folder) when it lies inside it."""
        folder = Path(base) if base is not None else Path.cwd()
        try:
            shown = str(Path(self.path).resolve().relative_to(folder.resolve()))
        except ValueError:
            shown = self.path
        return f"{shown}:{self.lineno}"


@dataclass(frozen=True)
class HazardSite:
    """The hazards of one kind dispatched from one source line.

    Attributes:
        label: the hazard's label, as `pitfalls.probes.syncs.hazard_label` gives it.
        line: the user's source line, or None when no frame outside torch and the suite dispatched it.
        in_backward: the op ran in autograd's backward, on behalf of the forward line given.
        count: how many times, over the whole located region.
    """

    label: str
    line: SourceLine | None
    in_backward: bool
    count: int

    @property
    def kind(self) -> HazardKind:
        """The readable op name and the rewrite that removes it."""
        return describe(self.label, in_backward=self.in_backward)


@dataclass(frozen=True)
class LocatedHazards:
    """What a `HazardLocator` saw.

    Attributes:
        sites: one entry per (label, line, forward or backward), most frequent first, then by file and line.
        counts: the counter's own figures; the site counts add up to them, label by label.
    """

    sites: tuple[HazardSite, ...]
    counts: HazardCounts

    @property
    def total(self) -> int:
        """The number of hazard calls of every kind."""
        return self.counts.total


def _source_line(key: _Key | None) -> SourceLine | None:
    if key is None:
        return None
    path, lineno, function = key
    return SourceLine(path, lineno, function, linecache.getline(path, lineno).strip())


def _is_engine_entry(frame: FrameType) -> bool:
    # The Python frames that hand a backward pass to the C++ engine (graph.py since torch 2.3, __init__.py before).
    name = frame.f_code.co_name
    if name == "_engine_run_backward":
        return True
    path = os.path.realpath(frame.f_code.co_filename)
    return path == os.path.join(_TORCH_DIR, "autograd", "__init__.py") and name in ("backward", "grad")


def _stack_key(frame: FrameType | None) -> tuple[_Key | None, bool]:
    """The innermost user frame from `frame` outwards, and whether the engine's entry was passed to reach it."""
    passed_engine = False
    while frame is not None:
        code = frame.f_code
        if is_user_file(code.co_filename):
            return (code.co_filename, frame.f_lineno, code.co_name), passed_engine
        passed_engine = passed_engine or _is_engine_entry(frame)
        frame = frame.f_back
    return None, passed_engine


def _forward_key(node: object) -> _Key | None:
    metadata = getattr(node, "metadata", None)
    entries = metadata.get("traceback_") if isinstance(metadata, dict) else None
    for entry in reversed(entries or ()):
        match = _FRAME_ENTRY.match(entry)
        if match and is_user_file(match["path"]):
            return match["path"], int(match["lineno"]), match["function"]
    return None


def _current_autograd_node() -> object | None:
    current = getattr(torch._C, "_current_autograd_node", None)
    return current() if current is not None else None


def locate_dispatch() -> tuple[_Key | None, bool]:
    """The user's line of the op being dispatched now, and whether it runs in backward."""
    frame = inspect.currentframe()
    try:
        key, passed_engine = _stack_key(frame)
    finally:
        del frame  # a frame held in a local would keep every caller's locals alive
    node = _current_autograd_node()
    if node is None:
        return key, False
    if key is not None and not passed_engine:
        return key, True  # the user's own Python running inside backward (custom Function, hook)
    # No forward stack when the node was built before anomaly mode was on: fall back to the backward() call.
    return _forward_key(node) or key, True


class HazardLocator:
    """Count sync hazards like `SyncHazardCounter`, and remember the user's source line of each.

    Args:
        label_ranges: also wrap each hazard call in a profiler range, as `SyncHazardCounter` does.

    Use `.result` after the block. Autograd anomaly mode (without its NaN check) is on inside the block, so
    that backward hazards can be traced to their forward line; it costs time, not syncs.
    """

    def __init__(self, *, label_ranges: bool = False) -> None:
        self._label_ranges = bool(label_ranges)
        self._sites: Counter[tuple[str, _Key | None, bool]] = Counter()
        self._counter: SyncHazardCounter | None = None
        self._stack: contextlib.ExitStack | None = None

    def __enter__(self) -> HazardLocator:
        self._sites.clear()
        with contextlib.ExitStack() as stack:
            # set_detect_anomaly switches the mode on when built, and back to the previous mode on exit.
            stack.enter_context(torch.autograd.set_detect_anomaly(True, check_nan=False))
            self._counter = stack.enter_context(
                SyncHazardCounter(label_ranges=self._label_ranges, on_hazard=self._record)
            )
            self._stack = stack.pop_all()  # both stay on past this block; a failure above undoes the first
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._stack is not None:
            stack, self._stack = self._stack, None
            stack.close()

    def _record(self, label: str) -> None:
        key, in_backward = locate_dispatch()
        self._sites[(label, key, in_backward)] += 1

    @property
    def result(self) -> LocatedHazards:
        """The hazards so far, each with its source line."""
        sites = [
            HazardSite(label, _source_line(key), in_backward, count)
            for (label, key, in_backward), count in self._sites.items()
        ]
        sites.sort(key=lambda s: (-s.count, s.line.path if s.line else "", s.line.lineno if s.line else 0, s.label))
        counts = self._counter.result if self._counter is not None else HazardCounts()
        return LocatedHazards(sites=tuple(sites), counts=counts)

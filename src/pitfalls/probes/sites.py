"""Where each sync hazard is written: the user's source line of every hazard a `SyncHazardCounter` sees.

A hazard's line is the innermost Python frame, at dispatch time, that lies outside torch and outside the suite's
measuring machinery (this package, the doctor, the scan command, the test guard, the command line). The suite's family
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

Each hazard also keeps its *call sites*: the user frames above its line, outwards up to the step (the first frame
of the measuring machinery, the standard library, or the test runner), so that a hazard inside a shared helper is
told apart by the line that called the helper, the line a user must rewrite; and the torch functions *between* its
line and the op (`HazardSite.via`), so that a sync torch makes on the line's behalf (GradScaler's read of
``found_inf`` inside ``scaler.step``) is told apart from the line's own.

A scalar read that C++ code makes in the autograd engine's own hooks and callbacks (no Python frame since the
engine's entry, and the engine runs no node, or a leaf's ``AccumulateGrad``, whose hooks run after it) is not the
script's and not a sync: it is DDP's reducer reading, a parameter at a time, the map of the parameters a backward
used (``find_unused_parameters=True``), which it keeps in host memory (torch/csrc/distributed/c10d/reducer.cpp,
``initialize_local_used_map``, ``finalize_bucket_dense``). The locator tells the counter not to count it.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import linecache
import os
import re
import sysconfig
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from types import FrameType

import torch

from pitfalls.probes.hostcopy import Provenance
from pitfalls.probes.rewrites import HazardKind, describe
from pitfalls.probes.syncs import HazardCounts, SyncHazardCounter

__all__ = [
    "CallSite", "HazardLocator", "HazardSite", "LocatedHazards", "SourceLine", "function_at", "functions",
    "is_user_file", "locate_dispatch", "locate_dispatch_stack", "script_caller", "source_line",
]

_TORCH_DIR = os.path.dirname(os.path.realpath(torch.__file__)) + os.sep
_PACKAGE_DIR = Path(__file__).resolve().parents[1]
# The measuring machinery: its frames sit between the user's code and torch and are never the answer.
_MACHINERY_DIRS = (str(_PACKAGE_DIR / "probes") + os.sep, str(_PACKAGE_DIR / "doctor") + os.sep)
_MACHINERY_FILES = frozenset(
    str(_PACKAGE_DIR / name) for name in ("scan.py", "targets.py", "hazard_guard.py", "pytest_plugin.py", "cli.py")
)
# The doctor's planted training scripts: a user's scripts, though they ship inside the doctor's package.
_PLANTED_DIR = str(_PACKAGE_DIR / "doctor" / "planted") + os.sep
# Anomaly mode stores frames as traceback.format_list() entries: '  File "x.py", line 3, in f\n    code\n'.
_FRAME_ENTRY = re.compile(r'\s*File "(?P<path>.+)", line (?P<lineno>\d+), in (?P<function>.+)')

_Key = tuple[str, int, str]  # path, line number, function
# Where the caller chain of a hazard stops: the step is called from here, never the user's code above it.
_STOP_DIRS = tuple(
    os.path.realpath(path) + os.sep for path in {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]}
)
_STOP_PACKAGES = ("_pytest", "pluggy", "asv_runner", "asv")
# The scalar reads, and torch's frames between one dispatch mode and the next (an op called from a mode, the
# wrappers that keep dynamo out of a mode's frames).
_SCALAR_READS = frozenset({"aten._local_scalar_dense.default", "aten.item.default"})
_DISPATCH_PLUMBING = ("torch._ops.", "torch.utils._python_dispatch.", "torch._dynamo.eval_frame.", "torch._compile.")
_MAX_CALLERS = 16


@lru_cache(maxsize=4096)
def _is_torch_file(filename: str) -> bool:
    return os.path.realpath(filename).startswith(_TORCH_DIR)


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
    if path.startswith(_PLANTED_DIR):
        return True
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

    def short_where(self) -> str:
        """`path:lineno` with the path relative to the working folder when it lies inside it."""
        try:
            shown = str(Path(self.path).resolve().relative_to(Path.cwd().resolve()))
        except ValueError:
            shown = self.path
        return f"{shown}:{self.lineno}"


@lru_cache(maxsize=4096)
def _is_boundary(filename: str) -> bool:
    """Whether a frame's file is where the caller chain of a hazard stops (see the module docstring)."""
    if filename.startswith("<"):
        return filename.startswith("<frozen")
    path = os.path.realpath(filename)
    if (path.startswith(_MACHINERY_DIRS) and not path.startswith(_PLANTED_DIR)) or path in _MACHINERY_FILES:
        return True
    if "site-packages" not in path and path.startswith(_STOP_DIRS):
        return True
    parts = Path(path).parts
    return any(package in parts for package in _STOP_PACKAGES)


@dataclass(frozen=True)
class CallSite:
    """One chain of user frames above a hazard's line, and how many of the line's hazards came through it.

    Attributes:
        frames: the callers, nearest first, up to the step; empty when the line is in the step itself.
        count: the hazards, over the whole located region, dispatched through this chain.
    """

    frames: tuple[SourceLine, ...]
    count: int


@dataclass(frozen=True)
class HazardSite:
    """The hazards of one kind dispatched from one source line.

    Attributes:
        label: the hazard's label, as `pitfalls.probes.syncs.hazard_label` gives it.
        line: the user's source line, or None when no frame outside torch and the suite dispatched it.
        in_backward: the op ran in autograd's backward, on behalf of the forward line given.
        count: how many times, over the whole located region.
        call_sites: the chains of callers above the line, most frequent first; their counts add up to `count`.
        via: the torch functions between the line and the op, outermost first (``module.qualname``, as
            ``torch.amp.grad_scaler.GradScaler.step``); empty when the line itself made the op, or in backward.
    """

    label: str
    line: SourceLine | None
    in_backward: bool
    count: int
    call_sites: tuple[CallSite, ...] = ()
    via: tuple[str, ...] = ()

    @property
    def kind(self) -> HazardKind:
        """The readable op name and the rewrite that removes it."""
        return describe(self.label, in_backward=self.in_backward, via=self.via)


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


def source_line(key: tuple[str, int, str] | None) -> SourceLine | None:
    """The `SourceLine` of a (path, line, function) key, as `locate_dispatch` gives it; None for None."""
    if key is None:
        return None
    path, lineno, function = key
    return SourceLine(path, lineno, function, linecache.getline(path, lineno).strip())


@lru_cache(maxsize=64)
def functions(path: str) -> tuple[tuple[int, int, str], ...]:
    """(first line, last line, name) of every function in a file, or none when it cannot be read."""
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return ()
    return tuple((node.lineno, node.end_lineno or node.lineno, node.name) for node in ast.walk(tree)
                 if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)))


def function_at(path: str, line: int) -> str:
    """The innermost function of ``path`` that holds ``line`` (its code object's name), ``<module>`` outside any."""
    holding = [(first, name) for first, last, name in functions(path) if first <= line <= last]
    return max(holding)[1] if holding else "<module>"


def _is_engine_entry(frame: FrameType) -> bool:
    # The Python frames that hand a backward pass to the C++ engine (graph.py since torch 2.3, __init__.py before).
    name = frame.f_code.co_name
    if name == "_engine_run_backward":
        return True
    path = os.path.realpath(frame.f_code.co_filename)
    return path == os.path.join(_TORCH_DIR, "autograd", "__init__.py") and name in ("backward", "grad")


def _callers(keys: list[tuple[_Key, bool]]) -> tuple[_Key, ...]:
    """The user frames of `keys` (frame, is-boundary pairs, innermost first) up to the first boundary."""
    found: list[_Key] = []
    for key, boundary in keys:
        if boundary or len(found) == _MAX_CALLERS:
            break
        if is_user_file(key[0]):
            found.append(key)
    return tuple(found)


def _qualified(frame: FrameType) -> str:
    """A frame's function as ``module.qualname`` (the bare name on Python 3.10, whose code has no qualname)."""
    code = frame.f_code
    return f"{frame.f_globals.get('__name__', '')}.{getattr(code, 'co_qualname', code.co_name)}"


def _stack_frames(
    frame: FrameType | None, skip: Collection[str] = ()
) -> tuple[_Key | None, tuple[_Key, ...], bool, tuple[str, ...]]:
    """The innermost user frame from `frame` outwards (passing over the files in `skip`), its callers, whether the
    engine's entry was passed, and the torch functions between that frame and the measuring machinery, outermost
    first (see `HazardSite.via`)."""
    passed_engine = False
    via: list[str] = []
    while frame is not None:
        code = frame.f_code
        if is_user_file(code.co_filename) and code.co_filename not in skip:
            key = (code.co_filename, frame.f_lineno, code.co_name)
            outer: list[tuple[_Key, bool]] = []
            above = frame.f_back
            while above is not None and len(outer) <= 4 * _MAX_CALLERS:
                name = above.f_code.co_filename
                outer.append(((name, above.f_lineno, above.f_code.co_name), _is_boundary(name)))
                above = above.f_back
            return key, _callers(outer), passed_engine, tuple(reversed(via))
        passed_engine = passed_engine or _is_engine_entry(frame)
        # Only the torch frames since the last of the machinery's: those inside it are the modes' own plumbing.
        via = [*via, _qualified(frame)] if _is_torch_file(code.co_filename) else []
        frame = frame.f_back
    return None, (), passed_engine, ()


def _forward_frames(node: object) -> tuple[_Key | None, tuple[_Key, ...]]:
    metadata = getattr(node, "metadata", None)
    entries = metadata.get("traceback_") if isinstance(metadata, dict) else None
    keys: list[_Key] = []
    for entry in reversed(entries or ()):  # innermost first
        match = _FRAME_ENTRY.match(entry)
        if match:
            keys.append((match["path"], int(match["lineno"]), match["function"]))
    for index, key in enumerate(keys):
        if is_user_file(key[0]):
            return key, _callers([(k, _is_boundary(k[0])) for k in keys[index + 1:]])
    return None, ()


def _current_autograd_node() -> object | None:
    current = getattr(torch._C, "_current_autograd_node", None)
    return current() if current is not None else None


def locate_dispatch(skip: Collection[str] = ()) -> tuple[_Key | None, bool]:
    """The user's line of the op being dispatched now, and whether it runs in backward; ``skip``: files to pass
    over besides torch and the measuring machinery (an instrument of a rule registered from outside the package)."""
    key, _, in_backward = locate_dispatch_stack(skip)
    return key, in_backward


def locate_dispatch_stack(skip: Collection[str] = ()) -> tuple[_Key | None, tuple[_Key, ...], bool]:
    """The user's line of the op being dispatched now, the user frames that called it, and whether in backward.

    Args:
        skip: files to pass over besides torch and the measuring machinery: a caller that runs inside other Python
            code (the warnings module, for a warning an op raised) names it.
    """
    return _locate(skip)[:3]


def _locate(skip: Collection[str] = ()) -> tuple[_Key | None, tuple[_Key, ...], bool, tuple[str, ...]]:
    """`locate_dispatch_stack`, and the torch functions between the line and the op (none in backward)."""
    frame = inspect.currentframe()
    try:
        key, callers, passed_engine, via = _stack_frames(frame, skip)
    finally:
        del frame  # a frame held in a local would keep every caller's locals alive
    node = _current_autograd_node()
    if node is None:
        return key, callers, False, via
    if key is not None and not passed_engine:
        return key, callers, True, via  # the user's own Python running inside backward (custom Function, hook)
    forward, forward_callers = _forward_frames(node)
    if forward is not None:
        return forward, forward_callers, True, ()
    # No forward stack when the node was built before anomaly mode was on: fall back to the backward() call.
    return key, callers, True, ()


def _in_engine_hook() -> bool:
    """Whether the op dispatched now is C++ code's in the autograd engine's own hooks or callbacks: the first frame
    past the measuring machinery's modes is the engine's entry, and the engine runs no node, or a leaf's
    AccumulateGrad (whose hooks run after it)."""
    frame = inspect.currentframe()
    try:
        while frame is not None and not _is_engine_entry(frame):
            name = frame.f_code.co_filename
            if is_user_file(name) or (_is_torch_file(name) and not _qualified(frame).startswith(_DISPATCH_PLUMBING)):
                return False
            frame = frame.f_back
    finally:
        del frame
    node = _current_autograd_node()
    return node is None or type(node).__name__ == "AccumulateGrad"


def script_caller(frame: FrameType | None) -> tuple[str, int, str] | None:
    """The user's line that called into torch, from ``frame`` (the frame calling a torch function) outwards: the
    first frame outside torch, as a (path, line, function) key; None when that frame is the measuring machinery's
    (the suite's own call, such as the hazard counter turning on anomaly mode)."""
    while frame is not None and _is_torch_file(frame.f_code.co_filename):
        frame = frame.f_back
    if frame is None or not is_user_file(frame.f_code.co_filename):
        return None
    return frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name


class HazardLocator:
    """Count sync hazards like `SyncHazardCounter`, and remember the user's source line of each.

    Args:
        provenance: the host-made tensors known so far, as `SyncHazardCounter` takes them.

    Use `.result` after the block. Autograd anomaly mode (without its NaN check) is on inside the block, so
    that backward hazards can be traced to their forward line; it costs time, not syncs.
    """

    def __init__(self, *, provenance: Provenance | None = None) -> None:
        self._provenance = provenance
        self._sites: Counter[tuple[str, _Key | None, bool, tuple[_Key, ...], tuple[str, ...]]] = Counter()
        self._counter: SyncHazardCounter | None = None
        self._stack: contextlib.ExitStack | None = None

    def __enter__(self) -> HazardLocator:
        self._sites.clear()
        with contextlib.ExitStack() as stack:
            # set_detect_anomaly switches the mode on when built, and back to the previous mode on exit.
            stack.enter_context(torch.autograd.set_detect_anomaly(True, check_nan=False))
            self._counter = stack.enter_context(SyncHazardCounter(on_hazard=self._record, provenance=self._provenance))
            self._stack = stack.pop_all()  # both stay on past this block; a failure above undoes the first
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._stack is not None:
            stack, self._stack = self._stack, None
            stack.close()

    def _record(self, label: str) -> bool:
        if label in _SCALAR_READS and _in_engine_hook():
            return False  # DDP's reducer reading its map of used parameters, in host memory (the module docstring)
        key, callers, in_backward, via = _locate()
        self._sites[(label, key, in_backward, callers, via)] += 1
        return True

    @property
    def result(self) -> LocatedHazards:
        """The hazards so far, each with its source line and the call sites above it."""
        grouped: dict[tuple[str, _Key | None, bool, tuple[str, ...]], Counter[tuple[_Key, ...]]] = {}
        for (label, key, in_backward, callers, via), count in self._sites.items():
            grouped.setdefault((label, key, in_backward, via), Counter())[callers] += count
        sites = []
        for (label, key, in_backward, via), chains in grouped.items():
            call_sites = tuple(
                CallSite(tuple(line for line in map(source_line, chain) if line is not None), n)
                for chain, n in sorted(chains.items(), key=lambda item: (-item[1], item[0]))
            )
            sites.append(HazardSite(label, source_line(key), in_backward, sum(chains.values()), call_sites, via))
        sites.sort(key=lambda s: (-s.count, s.line.path if s.line else "", s.line.lineno if s.line else 0, s.label))
        counts = self._counter.result if self._counter is not None else HazardCounts()
        return LocatedHazards(sites=tuple(sites), counts=counts)

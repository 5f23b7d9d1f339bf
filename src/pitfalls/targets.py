"""Turn a scan TARGET into the zero-argument step to run: FILE.py:NAME, MODULE:NAME or FAMILY/VARIANT.

NAME (dotted names reach attributes, e.g. `trainer.step`) is called once with no arguments: a factory's result is
the step, else NAME is the step and that call its warm-up (docs/scan.md). A file is loaded as a module of its own
name, without its folder on `sys.path`.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import re
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType, TracebackType

from pitfalls._import import file_module
from pitfalls.probes.sites import is_user_file

__all__ = ["ScannedCodeError", "Target", "TargetError", "call_scanned", "load_target", "required_parameters",
           "resolve_named", "scanned_traceback"]

FORMS = "FILE.py:NAME, MODULE:NAME or FAMILY/VARIANT"


class TargetError(ValueError):
    """The TARGET cannot be turned into a step: missing, not callable, needs arguments. One line, no traceback."""


class ScannedCodeError(Exception):
    """The scanned code raised; `error` is its exception, `stage` says what the scan was doing."""

    def __init__(self, target: str, stage: str, error: Exception) -> None:
        super().__init__(f"{target} raised {type(error).__name__} while {stage}: {error}")
        self.target = target
        self.stage = stage
        self.error = error


@dataclass(frozen=True)
class Target:
    """A loaded TARGET.

    Attributes:
        text: the TARGET as given.
        step: the zero-argument callable to scan.
        warmed_up: the step has already run once (NAME was the step itself, called to see what it returns).
    """

    text: str
    step: Callable[[], object]
    warmed_up: bool


def call_scanned(target: str, stage: str, fn: Callable[[], object]) -> object:
    """Call the scanned code, turning any exception it raises into a `ScannedCodeError` that keeps it."""
    try:
        return fn()
    except Exception as error:
        raise ScannedCodeError(target, stage, error) from error


def scanned_traceback(error: BaseException, is_scanned: Callable[[str], bool] = is_user_file) -> str:
    """Format an exception of the scanned code, its traceback starting at the first frame of a file ``is_scanned``."""
    tb: TracebackType | None = error.__traceback__
    while tb is not None and not is_scanned(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    # No frame of the scanned code (a SyntaxError in its file): the error still names the file and line.
    return "".join(traceback.format_exception(type(error), error, tb))


def _load_suite_case(text: str) -> Callable[[], object]:
    """One of the suite's own cases (a variant or the floor), at the smoke size `pitfalls check` counts at."""
    from pitfalls.cases import SkipCase, smoke_case
    from pitfalls.registry import all_families

    known = all_families()
    family, _, variant = text.partition("/")
    if family not in known:
        raise TargetError(f"TARGET {text!r}: no family {family!r}; families: {', '.join(known)} (forms: {FORMS})")
    if variant not in known[family].cases:
        allowed = ", ".join(known[family].cases)
        raise TargetError(f"TARGET {text!r}: family {family} has no variant {variant!r}; variants: {allowed}")
    try:
        return smoke_case(family, variant)
    except SkipCase as skip:
        raise TargetError(f"TARGET {text!r} cannot run here: {skip.reason}") from None


def _load_file(text: str, location: str) -> ModuleType:
    path = Path(location)
    if not path.is_file():
        what = "is a folder, not a file" if path.is_dir() else "does not exist"
        raise TargetError(f"TARGET {text!r}: {location} {what}")
    loaded = file_module(path.resolve(), "pitfalls_scan_target_")
    if loaded is None:
        raise TargetError(f"TARGET {text!r}: {location} cannot be loaded as Python (a .py file is needed)")
    module, run = loaded
    call_scanned(text, f"loading {location}", run)
    return module


def _import_module(text: str, name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except Exception as error:
        # Only the named module (or a package above it) being absent is a bad TARGET; an import failing inside
        # the user's module is the user's error, shown with its traceback.
        missing = error.name if isinstance(error, ModuleNotFoundError) else None
        if missing is not None and (name == missing or name.startswith(missing + ".")):
            raise TargetError(f"TARGET {text!r}: no module named {missing!r} (is it installed or on PYTHONPATH? "
                              f"a file is named with its path, e.g. train.py:step)") from None
        raise ScannedCodeError(text, f"importing {name}", error) from error


def required_parameters(fn: Callable[..., object]) -> list[str]:
    """The names of the parameters a call of ``fn`` must give (none known for a builtin without a signature)."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return []  # some builtins have no signature; calling them will tell
    return [p.name for p in parameters
            if p.default is inspect.Parameter.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def _check_no_arguments(text: str, what: str, fn: object) -> Callable[[], object]:
    if not callable(fn):
        raise TargetError(f"TARGET {text!r}: {what} is not callable (it is {type(fn).__name__} {fn!r:.60})")
    required = required_parameters(fn)
    if required:
        raise TargetError(f"TARGET {text!r}: {what} needs arguments ({', '.join(required)}); give a function that "
                          "takes none, or a factory with no arguments that returns one")
    return fn


def _attribute(text: str, module: ModuleType, where: str, name: str) -> object:
    value: object = module
    for part in name.split("."):
        if not hasattr(value, part):
            defined = sorted(
                key for key, item in vars(module).items()
                if callable(item) and not key.startswith("_") and getattr(item, "__module__", None) == module.__name__
            )
            listed = ", ".join(defined[:12]) + (", ..." if len(defined) > 12 else "") if defined else "nothing callable"
            raise TargetError(f"TARGET {text!r}: {where} has no {name!r}; it defines: {listed}")
        value = getattr(value, part)
    return value


def load_target(text: str,
                first_call: Callable[[], contextlib.AbstractContextManager[object]] = contextlib.nullcontext) -> Target:
    """Load a TARGET and return the step to scan (see the module docstring for the rule).

    Args:
        text: FILE.py:NAME, MODULE:NAME or FAMILY/VARIANT.
        first_call: makes the block NAME's first call runs in: when NAME is the step itself, that call is its
            warm-up (the scan records there what the step makes on the host).

    Returns:
        The `Target`.

    Raises:
        TargetError: the TARGET is malformed, missing, not callable or needs arguments.
        ScannedCodeError: the user's code raised while it was loaded or while NAME was called.
    """
    if ":" not in text:
        if re.fullmatch(r"\w+/\w+", text) and not text.endswith(".py"):
            return Target(text, _load_suite_case(text), warmed_up=False)
        raise TargetError(f"TARGET {text!r} names no function; expected {FORMS}")
    name = text.rpartition(":")[2]
    named = _check_no_arguments(text, name, resolve_named(text, malformed=f"TARGET {text!r} is not {FORMS}"))
    with first_call():
        returned = call_scanned(text, f"calling {name}()", named)
    if callable(returned) and not isinstance(returned, type):
        step = _check_no_arguments(text, f"the step {name}() returned", returned)
        return Target(text, step, warmed_up=False)
    return Target(text, named, warmed_up=True)


def resolve_named(text: str, malformed: str = "") -> object:
    """The object that ``FILE.py:NAME`` or ``MODULE:NAME`` names, its module loaded (nothing called).

    Args:
        text: FILE.py:NAME or MODULE:NAME.
        malformed: the error's message when ``text`` is of neither form ("": the forms named).

    Returns:
        The named object.

    Raises:
        TargetError: malformed, missing file or module, or no such name.
        ScannedCodeError: the user's module raised while it was loaded.
    """
    location, _, name = text.rpartition(":")
    if not location or not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", name):
        raise TargetError(malformed or f"{text!r} is not FILE.py:NAME or MODULE:NAME")
    is_file = location.endswith(".py") or "/" in location or "\\" in location
    module = _load_file(text, location) if is_file else _import_module(text, location)
    return _attribute(text, module, location, name)

"""The user's script: checked before it runs (present, valid Python), then run as ``__main__``, as ``python SCRIPT
ARGS...`` would run it (docs/doctor.md, "What it runs").
"""

from __future__ import annotations

import builtins
import contextlib
import os
import sys
import types
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Script", "ScriptError", "as_main", "load_script"]


class ScriptError(ValueError):
    """The script cannot be run (missing, not valid Python), or not under the launcher that started it: one line,
    exit 2."""


@dataclass(frozen=True)
class Script:
    """A script ready to run: its absolute path and its compiled module code."""

    path: Path
    code: types.CodeType


def load_script(path: str | os.PathLike[str]) -> Script:
    """Read and compile a script, or say in one line why it cannot run.

    Args:
        path: the script's path.

    Returns:
        The `Script`.

    Raises:
        ScriptError: the file is missing, is not a file, cannot be read or is not valid Python.
    """
    given = Path(path)
    if not given.exists():
        raise ScriptError(f"SCRIPT {str(path)!r} does not exist; give the path of a Python training script")
    if not given.is_file():
        raise ScriptError(f"SCRIPT {str(path)!r} is not a file; give the path of a Python training script")
    resolved = given.resolve()
    try:
        source = resolved.read_bytes()
    except OSError as error:
        raise ScriptError(f"SCRIPT {str(path)!r} cannot be read: {error.strerror}") from None
    try:
        code = compile(source, str(resolved), "exec", dont_inherit=True)
    except SyntaxError as error:
        raise ScriptError(f"SCRIPT {str(path)!r} is not valid Python: line {error.lineno}: {error.msg}") from None
    except ValueError as error:  # null bytes: not Python source at all
        raise ScriptError(f"SCRIPT {str(path)!r} is not valid Python: {error}") from None
    return Script(resolved, code)


@contextlib.contextmanager
def as_main(script: Script, args: Sequence[str]) -> Iterator[dict[str, object]]:
    """Make the script ``__main__`` for the block, with its own argv and path; everything is restored after.

    Args:
        script: the script.
        args: its arguments (``sys.argv[1:]``).

    Returns:
        A context manager yielding the globals to run the script's code in.
    """
    module = types.ModuleType("__main__")
    module.__file__ = str(script.path)
    module.__builtins__ = builtins  # type: ignore[attr-defined]
    module.__spec__ = None
    saved_argv, saved_path = sys.argv, list(sys.path)
    saved_main = sys.modules.get("__main__")
    sys.argv = [str(script.path), *args]
    sys.path[:1] = [str(script.path.parent)]
    sys.modules["__main__"] = module
    try:
        yield module.__dict__
    finally:
        sys.argv = saved_argv
        sys.path[:] = saved_path
        if saved_main is not None:
            sys.modules["__main__"] = saved_main
        else:
            sys.modules.pop("__main__", None)

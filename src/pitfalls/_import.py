"""Import what a user adds from outside the package: a Python file in no package (a family or a rule named by an
environment variable, a scan TARGET), and the plug-ins of an entry-point group."""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType
from typing import Protocol, TypeVar


class _HasName(Protocol):
    @property
    def name(self) -> str: ...


_Named = TypeVar("_Named", bound=_HasName)


class PluginLoadError(ValueError):
    """A registered plug-in could not be loaded; the message names where it came from and why."""


def file_module(path: Path, prefix: str) -> tuple[ModuleType, Callable[[], None]] | None:
    """A module object for a ``.py`` file and the call that runs it, or None when it cannot be loaded as Python.

    The module is registered in ``sys.modules`` under ``prefix`` plus the file's stem before it runs, as an import
    would register it: dataclasses and pickle look a class's module up by name. The caller runs it, so that it can
    say whose code raised.
    """
    name = prefix + re.sub(r"\W", "_", path.stem)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    loader = spec.loader
    return module, lambda: loader.exec_module(module)


def _load_target(target: str, variable: str) -> object:
    """Load ``module:attr`` or ``path/to/file.py:attr``, named by the environment variable ``variable``."""
    location, sep, attr = target.rpartition(":")
    if not sep or not location or not attr:
        raise PluginLoadError(f"{variable} entry {target!r} is not MODULE:NAME or FILE.py:NAME")
    if location.endswith(".py"):
        path = Path(location).expanduser().resolve()
        if not path.is_file():
            raise PluginLoadError(f"{variable} entry {target!r}: no such file {path}")
        loaded = file_module(path, "pitfalls_user_")
        if loaded is None:
            raise PluginLoadError(f"{variable} entry {target!r}: {path} cannot be imported")
        module, run = loaded
        run()
    else:
        module = importlib.import_module(location)
    try:
        return getattr(module, attr)
    except AttributeError:
        raise PluginLoadError(f"{variable} entry {target!r}: {location} has no {attr!r}") from None


def _plugins(group: str, variable: str) -> Iterator[tuple[str, object]]:
    """(where it came from, the loaded object or the error) for every plug-in of an entry-point group and of the
    environment variable ``variable`` (comma-separated ``MODULE:NAME`` or ``FILE.py:NAME``)."""
    for point in entry_points(group=group):
        source = f"entry point {point.name!r} ({point.value})"
        try:
            yield source, point.load()
        except Exception as error:  # a plug-in's import can fail in any way; it is reported, not hidden
            yield source, PluginLoadError(f"{source}: {type(error).__name__}: {error}")
    for target in filter(None, (t.strip() for t in os.environ.get(variable, "").split(","))):
        source = f"{variable} entry {target!r}"
        try:
            yield source, _load_target(target, variable)
        except PluginLoadError as error:
            yield source, error
        except Exception as error:  # the user's module raised while importing: reported with its type
            yield source, PluginLoadError(f"{source}: {type(error).__name__}: {error}")


def registered(builtin: Iterable[_Named], kind: type[_Named], group: str, variable: str
               ) -> tuple[dict[str, _Named], tuple[str, ...]]:
    """The built-in objects and the plug-ins of a group, by name; a plug-in that fails to load, is not a ``kind``
    or takes a name already taken is left out with a warning (one broken plug-in cannot stop the rest).

    Args:
        builtin: the package's own objects, each with a ``name``.
        kind: the class every plug-in must be an instance of.
        group: the entry-point group (``pitfalls.families``).
        variable: the environment variable that names plug-ins outside any package (``PITFALLS_FAMILIES``).

    Returns:
        (every object by name, the built-ins first; why each plug-in left out was left out).
    """
    found = {one.name: one for one in builtin}
    errors = []
    what = kind.__name__
    for source, loaded in _plugins(group, variable):
        if isinstance(loaded, PluginLoadError):
            errors.append(str(loaded))
        elif not isinstance(loaded, kind):
            errors.append(f"{source}: is a {type(loaded).__name__}, not a pitfalls.{what}")
        elif loaded.name in found:
            errors.append(f"{source}: a {what.lower()} named {loaded.name!r} is already registered")
        else:
            found[loaded.name] = loaded
    for error in errors:
        warnings.warn(f"pitfalls: {what.lower()} left out: {error}", stacklevel=3)
    return found, tuple(errors)

"""The one registry of pitfall families: the built-in entries, then those other packages register.

It feeds the asv params, the test parametrization, the CLI choices and the equivalence gate. A package adds a
family through the entry-point group ``pitfalls.families`` (the entry point names a `Family` object); a file
outside any package through ``PITFALLS_FAMILIES=path/to/file.py:NAME`` or ``module:NAME`` (comma-separated for
several). A family that fails to load is left out with a warning, so one broken plug-in cannot stop the suite;
`load_errors` lists what was left out and why.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import warnings
from collections.abc import Iterator
from importlib.metadata import entry_points
from pathlib import Path

from pitfalls._checks import check_choice
from pitfalls._import import file_module
from pitfalls.families import loader, loss, parallel, planted, sampler
from pitfalls.family import Family

ENTRY_POINT_GROUP = "pitfalls.families"
FAMILIES_ENV = "PITFALLS_FAMILIES"
BUILTIN: tuple[Family, ...] = (loss.FAMILY, sampler.FAMILY, loader.FAMILY, parallel.FAMILY, planted.FAMILY)


class FamilyLoadError(ValueError):
    """A registered family could not be loaded; the message names where it came from and why."""


def _load_target(target: str) -> object:
    """Load ``module:attr`` or ``path/to/file.py:attr``."""
    location, sep, attr = target.rpartition(":")
    if not sep or not location or not attr:
        raise FamilyLoadError(f"{FAMILIES_ENV} entry {target!r} is not MODULE:NAME or FILE.py:NAME")
    if location.endswith(".py"):
        path = Path(location).expanduser().resolve()
        if not path.is_file():
            raise FamilyLoadError(f"{FAMILIES_ENV} entry {target!r}: no such file {path}")
        loaded = file_module(path, "pitfalls_user_family_")
        if loaded is None:
            raise FamilyLoadError(f"{FAMILIES_ENV} entry {target!r}: {path} cannot be imported")
        module, run = loaded
        run()
    else:
        module = importlib.import_module(location)
    try:
        return getattr(module, attr)
    except AttributeError:
        raise FamilyLoadError(f"{FAMILIES_ENV} entry {target!r}: {location} has no {attr!r}") from None


def _plugins() -> Iterator[tuple[str, object]]:
    """(where it came from, the loaded object or the error) for every registered family beyond the built-ins."""
    for point in entry_points(group=ENTRY_POINT_GROUP):
        source = f"entry point {point.name!r} ({point.value})"
        try:
            yield source, point.load()
        except Exception as error:  # a plug-in's import can fail in any way; it is reported, not hidden
            yield source, FamilyLoadError(f"{source}: {type(error).__name__}: {error}")
    for target in filter(None, (t.strip() for t in os.environ.get(FAMILIES_ENV, "").split(","))):
        source = f"{FAMILIES_ENV} entry {target!r}"
        try:
            yield source, _load_target(target)
        except FamilyLoadError as error:
            yield source, error
        except Exception as error:  # the user's module raised while importing: reported with its type
            yield source, FamilyLoadError(f"{source}: {type(error).__name__}: {error}")


@functools.cache
def _registry() -> tuple[dict[str, Family], tuple[str, ...]]:
    found = {family.name: family for family in BUILTIN}
    errors = []
    for source, loaded in _plugins():
        if isinstance(loaded, FamilyLoadError):
            errors.append(str(loaded))
        elif not isinstance(loaded, Family):
            errors.append(f"{source}: is a {type(loaded).__name__}, not a pitfalls.Family")
        elif loaded.name in found:
            errors.append(f"{source}: a family named {loaded.name!r} is already registered")
        else:
            found[loaded.name] = loaded
    for error in errors:
        warnings.warn(f"pitfalls: family left out: {error}", stacklevel=2)
    return found, tuple(errors)


def reload() -> None:
    """Forget the loaded families, so the next call reads the entry points and the environment again."""
    _registry.cache_clear()


def all_families() -> dict[str, Family]:
    """Every registered family by name: the built-ins first, then the plug-ins."""
    return dict(_registry()[0])


def load_errors() -> tuple[str, ...]:
    """Why each registered family that failed to load was left out."""
    return _registry()[1]


def plugin_families() -> tuple[Family, ...]:
    """The families registered by other packages or by ``PITFALLS_FAMILIES``."""
    builtin = {f.name for f in BUILTIN}
    return tuple(f for name, f in _registry()[0].items() if name not in builtin)


def family_names() -> tuple[str, ...]:
    """Return the family names."""
    return tuple(_registry()[0])


def family(name: str) -> Family:
    """Return one family, or raise ValueError listing the known ones."""
    known = _registry()[0]
    return known[check_choice("family", name, known)]


def variants(name: str) -> tuple[str, ...]:
    """Return the variant names of a family, the naive one first."""
    return family(name).variants


def baseline(name: str) -> str:
    """Return the name of a family's naive variant, the one every other is compared with."""
    return family(name).baseline

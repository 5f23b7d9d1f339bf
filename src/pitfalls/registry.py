"""The one registry of pitfall families: the built-in entries, then those other packages register.

It feeds the asv params, the test parametrization, the CLI choices and the equivalence gate. A package adds a
family through the entry-point group ``pitfalls.families`` (the entry point names a `Family` object); a file
outside any package through ``PITFALLS_FAMILIES=path/to/file.py:NAME`` or ``module:NAME`` (comma-separated for
several). A family that fails to load is left out with a warning, so one broken plug-in cannot stop the suite;
`load_errors` lists what was left out and why.
"""

from __future__ import annotations

import functools

from pitfalls._checks import check_choice
from pitfalls._import import registered
from pitfalls.families import calibration, loader, loss, parallel, sampler
from pitfalls.family import Family

ENTRY_POINT_GROUP = "pitfalls.families"
FAMILIES_ENV = "PITFALLS_FAMILIES"
BUILTIN: tuple[Family, ...] = (loss.FAMILY, sampler.FAMILY, loader.FAMILY, parallel.FAMILY, calibration.FAMILY)


@functools.cache
def _registry() -> tuple[dict[str, Family], tuple[str, ...]]:
    return registered(BUILTIN, Family, ENTRY_POINT_GROUP, FAMILIES_ENV)


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

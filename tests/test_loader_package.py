"""The loader family's package: no import circle runs through it, and its entry is the one the registry lists."""

from __future__ import annotations

from test_site_imports import PACKAGE_MODULES, cycles_through, imported_modules

from pitfalls import registry
from pitfalls.families import loader

LOADER_MODULES = {name for name in PACKAGE_MODULES if name.startswith("pitfalls.families.loader")}


def test_the_loader_is_a_package_of_small_modules() -> None:
    assert {"pitfalls.families.loader.steps", "pitfalls.families.loader.probes",
            "pitfalls.families.loader.entry"} <= LOADER_MODULES


def test_no_import_circle_runs_through_the_loader_package() -> None:
    known = set(PACKAGE_MODULES)
    graph = {name: imported_modules(name, known) for name in PACKAGE_MODULES}
    assert cycles_through(graph, LOADER_MODULES) == []
    # Only the package's own __init__ imports it: the modules inside place cases through `entry`.
    importers = {name for name, imports in graph.items() if "pitfalls.families.loader" in imports}
    assert not importers & (LOADER_MODULES - {"pitfalls.families.loader"})


def test_the_registered_family_measures_its_own_figures() -> None:
    assert registry.family("loader") is loader.FAMILY
    assert loader.FAMILY.own_figures is loader.probes.own_figures
    assert loader.FAMILY.params == loader.ENTRY.params and loader.FAMILY.builder is loader.build

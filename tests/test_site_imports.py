"""The site package's modules import without a circle, so each command module is loaded once when it runs."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import pitfalls
import pitfalls.site

PACKAGE_MODULES = sorted(
    info.name for info in pkgutil.walk_packages(pitfalls.__path__, "pitfalls.") if not info.name.endswith("__main__")
)
SITE_MODULES = [name for name in PACKAGE_MODULES if name.startswith("pitfalls.site.")]


def imported_modules(name: str, known: set[str]) -> set[str]:
    """The modules of ``known`` that module ``name`` imports anywhere in its source (functions included)."""
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.origin is not None, name
    is_package = spec.submodule_search_locations is not None
    package = name if is_package else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(Path(spec.origin).read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            # `from pitfalls.site import assets` imports the submodule; `from x import name` imports x.
            candidates = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for candidate in candidates:
            if candidate in known:
                found.add(candidate)
                break
    found.discard(name)
    return found


def cycles_through(graph: dict[str, set[str]], members: set[str]) -> list[list[str]]:
    """Every import circle (as a path that returns to its start) that passes through a module of ``members``."""
    found = []
    for start in sorted(members):
        stack = [(start, [start])]
        seen = set()
        while stack:
            node, path = stack.pop()
            for following in sorted(graph.get(node, ())):
                if following == start:
                    found.append([*path, start])
                elif following not in seen:
                    seen.add(following)
                    stack.append((following, [*path, following]))
    return found


def test_the_import_walker_finds_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles_through(graph, {"a"}) == [["a", "b", "c", "a"]]
    assert cycles_through(graph, {"d"}) == []


def test_the_import_walker_sees_imports_inside_functions() -> None:
    # assets imports rebuild only inside main(), for --refresh: that is an edge too.
    assert "pitfalls.site.rebuild" in imported_modules("pitfalls.site.assets", set(PACKAGE_MODULES))


@pytest.mark.parametrize("name", SITE_MODULES)
def test_every_site_module_imports(name: str) -> None:
    importlib.import_module(name)


def test_no_import_circle_runs_through_the_site_package() -> None:
    known = set(PACKAGE_MODULES)
    graph = {name: imported_modules(name, known) for name in PACKAGE_MODULES}
    assert {"pitfalls.site.assets", "pitfalls.site.rebuild"} <= set(SITE_MODULES)
    assert cycles_through(graph, set(SITE_MODULES)) == []


def test_the_refresh_command_loads_its_module_once() -> None:
    """`python -m pitfalls.site.assets --refresh` runs assets as __main__, then imports rebuild."""
    code = "import sys, pitfalls.site.rebuild; print('pitfalls.site.assets' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    # rebuild is what --refresh imports; had it imported assets, the running __main__ would be loaded again.
    assert done.stdout.strip() == "False"

"""Every module of the package imports by its dotted path: no name of the package shadows one of its modules."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

import pitfalls

PACKAGE = Path(pitfalls.__file__).parent


def modules() -> list[str]:
    """Every module and package under pitfalls, by dotted path, from the files (not from what imports them)."""
    found = ["pitfalls"]
    for info in pkgutil.walk_packages([str(PACKAGE)], prefix="pitfalls."):
        if info.name.rpartition(".")[2] != "__main__":  # importing a __main__ runs its command
            found.append(info.name)
    return sorted(found)


def test_the_walk_finds_the_family_modules():
    assert {"pitfalls.families.loss", "pitfalls.families.sampler", "pitfalls.probes.syncs"} <= set(modules())


def test_every_module_imports_by_its_dotted_path_in_a_fresh_interpreter():
    # `import a.b.c as m` binds m by attribute lookup on a.b: it fails where a.b's attribute c is something else.
    script = "\n".join(f"import {name} as m; assert m.__name__ == {name!r}, m" for name in modules())
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def test_the_family_modules_are_modules_not_registry_functions():
    import pitfalls.families.loss as loss_module

    assert loss_module.__name__ == "pitfalls.families.loss"
    assert callable(pitfalls.registry.family_names)

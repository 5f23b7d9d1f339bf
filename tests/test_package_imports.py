"""Every module of the package imports by its dotted path: no name of the package shadows one of its modules; the
public names (`pitfalls.__all__`) are imported on first use, so that a process that needs one module (a rank of a
process group) does not import the rest."""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import pitfalls
from pitfalls import registry
from pitfalls.families import loss

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


def test_every_public_name_is_the_object_its_module_defines() -> None:
    for name in pitfalls.__all__:
        value = getattr(pitfalls, name)
        assert value is not None, name
        assert name in dir(pitfalls)
    assert pitfalls.family_entry is registry.family and pitfalls.make_train_step is loss.make_train_step
    # The module of Family and Case, not the registry's function of the same name.
    from pitfalls import family

    assert family.Family is pitfalls.Family


def test_an_unknown_name_is_an_attribute_error_naming_it() -> None:
    with pytest.raises(AttributeError, match="'no_such_name'"):
        pitfalls.no_such_name  # noqa: B018


def test_a_rank_imports_neither_the_families_it_does_not_run_nor_the_doctor_nor_rich() -> None:
    # A rank process starts with `python -m pitfalls.families.parallel.rank`: torch and its own family, no more.
    done = subprocess.run([sys.executable, "-c", "import json, sys, pitfalls.families.parallel.rank; "
                           "print(json.dumps(sorted(sys.modules)))"], capture_output=True, text=True, check=True)
    loaded = set(json.loads(done.stdout))
    assert "pitfalls.families.parallel.rank" in loaded and "torch" in loaded
    unwanted = {"pitfalls.registry", "pitfalls.doctor", "pitfalls.families.sampler", "pitfalls.families.loader",
                "rich", "matplotlib"}
    assert not loaded & unwanted, sorted(loaded & unwanted)

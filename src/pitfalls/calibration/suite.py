"""The asv suite's own module (benchmarks/common.py), imported from this checkout as asv imports it."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from pitfalls.probes.result import Unavailable

ROOT = Path(__file__).resolve().parents[3]


def suite_module(name: str = "common") -> ModuleType | Unavailable:
    """``benchmarks.<name>`` of this checkout (a package: its modules import ``.common``), or why not.

    Args:
        name: the module under benchmarks/.

    Returns:
        The module, or `Unavailable` when the package is installed without its checkout's benchmarks/ folder.
    """
    folder = ROOT / "benchmarks"
    if not (folder / f"{name}.py").is_file():
        return Unavailable(f"no asv suite next to the package ({folder / name}.py)")
    if "benchmarks" not in sys.modules:
        spec = importlib.util.spec_from_file_location("benchmarks", folder / "__init__.py",
                                                      submodule_search_locations=[str(folder)])
        if spec is None or spec.loader is None:
            return Unavailable(f"cannot import {folder}")
        package = importlib.util.module_from_spec(spec)
        sys.modules["benchmarks"] = package
        spec.loader.exec_module(package)
    return importlib.import_module(f"benchmarks.{name}")

"""The checkout's asv suite imported as asv imports it: ``benchmarks`` as a package (its modules import ``.common``)."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def import_suite_module(name: str) -> ModuleType:
    """``benchmarks.<name>`` of this checkout."""
    if "benchmarks" not in sys.modules:
        folder = ROOT / "benchmarks"
        spec = importlib.util.spec_from_file_location(
            "benchmarks", folder / "__init__.py", submodule_search_locations=[str(folder)]
        )
        assert spec is not None and spec.loader is not None
        package = importlib.util.module_from_spec(spec)
        sys.modules["benchmarks"] = package
        spec.loader.exec_module(package)
    return importlib.import_module(f"benchmarks.{name}")

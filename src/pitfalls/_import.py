"""Import a Python file that is not in any package: a user's family (PITFALLS_FAMILIES), a scan TARGET."""

from __future__ import annotations

import importlib.util
import re
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType


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

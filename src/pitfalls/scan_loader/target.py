"""Turn `pitfalls scan-loader`'s TARGET and STEP into a DataLoader and a step of one batch (docs/scan-loader.md).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from pitfalls.targets import TargetError, call_scanned, required_parameters, resolve_named

__all__ = ["TARGET_FORMS", "Step", "is_users", "load_loader", "load_step"]

TARGET_FORMS = "FILE.py:NAME or MODULE:NAME"
Step = Callable[[Any], object]

_PACKAGE_DIR = str(Path(__file__).resolve().parents[1]) + os.sep
_TORCH_DIR = os.path.dirname(os.path.realpath(torch.__file__)) + os.sep


def load_loader(text: str, batch_size: int = 32) -> DataLoader[Any]:
    """The DataLoader that TARGET names, builds or wraps.

    Args:
        text: FILE.py:NAME or MODULE:NAME.
        batch_size: the batch size a bare Dataset is wrapped with.

    Returns:
        The user's DataLoader (or their Dataset wrapped in one).

    Raises:
        TargetError: missing, malformed, or neither a DataLoader, a Dataset nor a callable returning one.
        ScannedCodeError: the user's code raised while it was loaded or called.
    """
    named = resolve_named(text)
    value = named
    if not isinstance(named, (DataLoader, Dataset)):
        if not callable(named):
            raise TargetError(f"TARGET {text!r} is a {type(named).__name__}, not a DataLoader, a Dataset "
                              "or a function returning one")
        needed = required_parameters(named)
        if needed:
            raise TargetError(f"TARGET {text!r} needs arguments ({', '.join(needed)}); give a function of no "
                              "arguments that returns a DataLoader or a Dataset")
        value = call_scanned(text, f"calling {text.rpartition(':')[2]}()", named)
    if isinstance(value, DataLoader):
        return value
    if isinstance(value, Dataset):
        return DataLoader(value, batch_size=batch_size, shuffle=False, drop_last=True)
    raise TargetError(f"TARGET {text!r} returned a {type(value).__name__}, not a DataLoader or a Dataset")


def load_step(text: str) -> Step:
    """The step that STEP names: called with one batch, already on the device.

    Raises:
        TargetError: missing, malformed, not callable, or taking other than one argument.
        ScannedCodeError: the user's code raised while it was loaded or called.
    """
    try:
        named = resolve_named(text)
    except TargetError as error:  # its messages name a TARGET; here it is the STEP
        raise TargetError(str(error).replace("TARGET", "STEP", 1)) from None
    if not callable(named):
        raise TargetError(f"STEP {text!r} is a {type(named).__name__}, not callable")
    needed = required_parameters(named)
    if not needed and not isinstance(named, type):
        # A factory: what it returns is the step.
        named = call_scanned(text, f"calling {text.rpartition(':')[2]}()", named)
        if not callable(named):
            raise TargetError(f"STEP {text!r} returned a {type(named).__name__}, not a step taking a batch")
        needed = required_parameters(named)
    if len(needed) > 1:
        raise TargetError(f"STEP {text!r} needs {len(needed)} arguments ({', '.join(needed)}); a step takes one "
                          "batch")
    return named


def is_users(filename: str) -> bool:
    """Whether a traceback's file is the user's: neither torch's nor this suite's."""
    return not os.path.realpath(filename).startswith((_PACKAGE_DIR, _TORCH_DIR))

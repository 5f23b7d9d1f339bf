"""Instruments off for a block: the torch function and dispatch modes on the stack are popped, then pushed back.

A DataLoader started with fork copies this process as it is at that moment, mode stacks included: its workers
must not start, nor the loader's own work run, under an instrument of the doctor.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch.overrides import _pop_mode, _push_mode
from torch.utils._python_dispatch import _disable_current_modes

__all__ = ["no_modes"]


@contextlib.contextmanager
def no_modes() -> Iterator[None]:
    """Run the block with no torch function mode and no dispatch mode; the stacks are as they were after it."""
    functions = []
    while torch._C._len_torch_function_stack() > 0:
        functions.append(_pop_mode())
    try:
        with _disable_current_modes():
            yield
    finally:
        for mode in reversed(functions):
            _push_mode(mode)

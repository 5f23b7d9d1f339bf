"""How the script set up its training, watched over the whole run for the GPU path's rules (`rules.training`,
`rules.settings`): where it made each DataParallel and DDP wrapper, and the settings that slow every step as they were
at the first step's end, before the doctor's instruments run, each with the script's call that set it, seen by
wrapping the function torch routes it through (docs/doctor.md, "The GPU path's rules").
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch.nn.parallel import DataParallel, DistributedDataParallel
from torch.optim.optimizer import register_optimizer_step_post_hook

from pitfalls.doctor.definitions import Definitions
from pitfalls.probes.sites import SourceLine, locate_dispatch, script_caller, source_line

__all__ = ["ANOMALY", "DETERMINISTIC", "LAUNCH_BLOCKING", "PROFILER", "SetupWatch"]

# The settings read at the first step's end, and whether each is on.
ANOMALY = "anomaly detection"
PROFILER = "profiler"
DETERMINISTIC = "deterministic algorithms"
LAUNCH_BLOCKING = "CUDA_LAUNCH_BLOCKING=1"
_READ: dict[str, Callable[[], bool]] = {
    ANOMALY: torch.is_anomaly_enabled,
    PROFILER: torch._C._autograd._profiler_enabled,
    DETERMINISTIC: torch.are_deterministic_algorithms_enabled,
    LAUNCH_BLOCKING: lambda: os.environ.get("CUDA_LAUNCH_BLOCKING", "").strip() == "1",
}


class SetupWatch:
    """Watch the script's set-up over the whole run; what it saw stays in its attributes after the block.

    Attributes:
        definitions: where the script made each DataParallel and DistributedDataParallel wrapper.
        left_on: each setting on at the first step's end, with the line of the script's call that turned it on
            (None: not seen, such as a variable of the environment the script was started with).
        first_step: the script's line whose call ended the first step (its optimizer's step).
        read: the settings were read (a first step ended).
    """

    def __init__(self) -> None:
        self.definitions = Definitions((DataParallel, DistributedDataParallel))
        self.left_on: dict[str, SourceLine | None] = {}
        self.first_step: SourceLine | None = None
        self.read = False
        self._turned_on: dict[str, SourceLine | None] = {}  # the script's latest call that turned each setting on
        self._undo = contextlib.ExitStack()

    def _record(self, setting: str, on: bool) -> None:
        line = script_caller(sys._getframe(2))  # the wrapper's caller, or the torch code it came through
        if on and line is not None:
            self._turned_on[setting] = source_line(line)

    def _first_step(self, _optimizer: object, _args: object, _kwargs: object) -> None:
        if self.read:
            return
        self.read = True
        self.first_step = source_line(locate_dispatch()[0])
        self.left_on = {setting: self._turned_on.get(setting) for setting, is_on in _READ.items() if is_on()}

    def _wrapped(self, owner: object, name: str, setting: str, on: Callable[..., bool]) -> None:
        """Wrap ``owner.name`` for the block: each call of the script's is recorded, ``on(*args)`` saying whether it
        turns the setting on."""
        original = getattr(owner, name)
        watch = self

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            watch._record(setting, on(*args, **kwargs))
            return original(*args, **kwargs)

        setattr(owner, name, wrapper)
        self._undo.callback(setattr, owner, name, original)

    def __enter__(self) -> SetupWatch:
        self._undo.enter_context(self.definitions)
        self._undo.callback(register_optimizer_step_post_hook(self._first_step).remove)
        self._wrapped(torch, "set_anomaly_enabled", ANOMALY, lambda enabled, *_a, **_k: bool(enabled))
        self._wrapped(torch, "use_deterministic_algorithms", DETERMINISTIC, lambda mode, *_a, **_k: bool(mode))
        self._wrapped(torch.autograd.profiler.profile, "_start_trace", PROFILER, lambda *_a, **_k: True)
        self._wrapped(type(os.environ), "__setitem__", LAUNCH_BLOCKING,
                      lambda _env, key, value: key == "CUDA_LAUNCH_BLOCKING" and str(value).strip() == "1")
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._undo.close()

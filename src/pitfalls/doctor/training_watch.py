"""What DDP and GradScaler do during the scanned steps, for the GPU path's rules (`rules.training`): each DDP forward
that arms its backward's all-reduce, read at the forward, and whether that backward ran inside ``no_sync()``, read by
a hook on the forward's outputs; whether every parameter was used; each ``GradScaler.scale`` with the autocast dtypes
of its forward (docs/doctor.md, "The GPU path's rules").
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.amp.autocast_mode import autocast
from torch.amp.grad_scaler import GradScaler
from torch.nn.parallel import DistributedDataParallel
from torch.utils._pytree import tree_flatten

from pitfalls.doctor.cuda_on_cpu import no_modes
from pitfalls.doctor.records import ScanContext
from pitfalls.probes.sites import SourceLine, locate_dispatch, source_line

__all__ = ["DdpForward", "DdpSeen", "TrainingWatch"]

_Key = tuple[str, int, str] | None
# The devices whose autocast state a GradScaler.scale call reads (a script written for CUDA runs the CPU's under
# --cuda-on-cpu).
_AUTOCAST_DEVICES = ("cuda", "cpu")


@dataclass
class DdpForward:
    """A forward of a DDP module that armed its backward's all-reduce, at the script's line.

    Attributes:
        line: the script's line that called the module.
        backward: its backward ran.
        in_no_sync: its backward ran inside ``no_sync()``.
        all_used: its backward used every parameter (None: not read, or DDP does not look for unused ones).
    """

    line: SourceLine | None
    backward: bool = False
    in_no_sync: bool = False
    all_used: bool | None = None


@dataclass
class DdpSeen:
    """What one DDP module did during the scanned steps: the module (weakly) and each forward that armed an
    all-reduce, in order."""

    module: weakref.ref[DistributedDataParallel]
    armed: list[DdpForward] = field(default_factory=list)


class TrainingWatch:
    """Watch DDP and GradScaler during the scanned steps; what it saw stays in its attributes after the block.

    Attributes:
        ddp: what each DDP module did, by its id.
        bf16_scales: the enabled ``GradScaler.scale`` calls whose forward ran under bfloat16 autocast alone, by the
            script's line.
    """

    def __init__(self, _context: ScanContext | None = None) -> None:
        self.ddp: dict[int, DdpSeen] = {}
        self.bf16_scales: Counter[_Key] = Counter()
        self._dtypes: set[torch.dtype] = set()  # autocast's dtypes since the last scale() call
        self._undo = contextlib.ExitStack()

    # -- DDP ------------------------------------------------------------------------------------------------------

    def _seen(self, ddp: DistributedDataParallel) -> DdpSeen:
        seen = self.ddp.get(id(ddp))
        if seen is None or seen.module() is not ddp:
            seen = self.ddp[id(ddp)] = DdpSeen(weakref.ref(ddp))
        return seen

    @staticmethod
    def _read_used(seen: DdpSeen) -> None:
        """Read whether the last armed backward used every parameter, where DDP looks for unused ones (the
        reducer's map of the parameters that backward used)."""
        ddp, last = seen.module(), seen.armed[-1] if seen.armed else None
        if ddp is None or last is None or not last.backward or last.all_used is not None:
            return
        if not ddp.find_unused_parameters or ddp.static_graph:
            return
        used_map = getattr(ddp.reducer, "_get_local_used_map", None)
        if used_map is not None:
            with no_modes():  # the doctor's own read: no hazard of the script's
                last.all_used = bool(used_map().all())

    @staticmethod
    def _backward(record: DdpForward, module: weakref.ref[DistributedDataParallel], _grad: torch.Tensor) -> None:
        ddp = module()
        record.backward = True
        record.in_no_sync |= ddp is not None and not ddp.require_backward_grad_sync

    def _forward(self, original: Callable[..., Any]) -> Callable[..., Any]:
        watch = self

        @functools.wraps(original)
        def forward(ddp: DistributedDataParallel, *args: Any, **kwargs: Any) -> Any:
            if getattr(ddp, "_use_python_reducer", False):
                return original(ddp, *args, **kwargs)
            seen = watch._seen(ddp)
            watch._read_used(seen)
            armed = torch.is_grad_enabled() and ddp.require_backward_grad_sync
            output = original(ddp, *args, **kwargs)
            if armed:
                record = DdpForward(source_line(locate_dispatch()[0]))
                seen.armed.append(record)
                hook = functools.partial(TrainingWatch._backward, record, weakref.ref(ddp))
                for leaf in tree_flatten(output)[0]:
                    if isinstance(leaf, torch.Tensor) and leaf.requires_grad:
                        leaf.register_hook(hook)
            return output

        return forward

    # -- AMP ------------------------------------------------------------------------------------------------------

    def _autocast_enter(self, original: Callable[..., Any]) -> Callable[..., Any]:
        watch = self

        @functools.wraps(original)
        def enter(region: autocast) -> Any:
            if region._enabled:
                watch._dtypes.add(region.fast_dtype)
            return original(region)

        return enter

    def _scale(self, original: Callable[..., Any]) -> Callable[..., Any]:
        watch = self

        @functools.wraps(original)
        def scale(scaler: GradScaler, outputs: Any) -> Any:
            if scaler.is_enabled():
                dtypes = watch._dtypes | {torch.get_autocast_dtype(device) for device in _AUTOCAST_DEVICES
                                          if torch.is_autocast_enabled(device)}
                if dtypes == {torch.bfloat16}:
                    watch.bf16_scales[locate_dispatch()[0]] += 1
            watch._dtypes = set()
            return original(scaler, outputs)

        return scale

    # -- on and off -------------------------------------------------------------------------------------------------

    def _patch(self, owner: type, name: str, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
        original = vars(owner)[name]
        setattr(owner, name, wrap(original))
        self._undo.callback(setattr, owner, name, original)

    def __enter__(self) -> TrainingWatch:
        self._patch(DistributedDataParallel, "forward", self._forward)
        self._patch(autocast, "__enter__", self._autocast_enter)
        self._patch(GradScaler, "scale", self._scale)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._undo.close()
        for seen in self.ddp.values():
            self._read_used(seen)  # the last scanned step's backward

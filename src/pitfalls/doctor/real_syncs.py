"""What only a GPU can tell: each line's real syncs, CUDA's sync debug mode's warnings placed at the script's line,
and what each sync stalls, timed on the host (the GPU phase's instrument; docs/doctor.md, "What it runs").
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from pitfalls.probes.hostcopy import eager_stance
from pitfalls.probes.sites import locate_dispatch, locate_dispatch_stack
from pitfalls.probes.syncs import CUDA_SYNC_WARNING, hazard_label

__all__ = ["RealSyncs"]

_Key = tuple[str, int, str]


def _touches_cuda(args: tuple, kwargs: dict[str, Any]) -> bool:
    return any(isinstance(leaf, torch.Tensor) and leaf.device.type == "cuda"
               for leaf in tree_flatten((args, kwargs))[0])


class _StallMode(TorchDispatchMode):
    """Time, on the host, each sync-hazard op on CUDA tensors, by the script's line."""

    def __init__(self, clock: Callable[[], float]) -> None:
        super().__init__()
        self._clock = clock
        self.seconds: defaultdict[_Key | None, float] = defaultdict(float)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204 (torch's protocol)
        kwargs = kwargs or {}
        if hazard_label(func, args, kwargs) is None or not _touches_cuda(args, kwargs):
            return func(*args, **kwargs)
        began = self._clock()
        out = func(*args, **kwargs)
        self.seconds[locate_dispatch()[0]] += self._clock() - began
        return out


class RealSyncs:
    """Count real CUDA syncs and time each hazard's stall by line, over the block.

    Args:
        clock: seconds as a float.
        cuda: the `torch.cuda`-like module whose sync debug mode is set (tests pass a fake); None: `torch.cuda`.
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter, cuda: Any = None) -> None:
        self._cuda = cuda if cuda is not None else torch.cuda
        self.syncs: Counter[_Key | None] = Counter()
        self._stall = _StallMode(clock)
        self._stack: contextlib.ExitStack | None = None
        self._passed_on: Callable[..., None] = warnings.showwarning

    def _show(self, message: Any, category: type[Warning], filename: str, lineno: int, file: Any = None,
              line: str | None = None) -> None:
        if CUDA_SYNC_WARNING in str(message):
            # The warnings module calls this: its frames are not the script's. A backward op's warning comes from
            # autograd's thread, with no Python frame above it: its line is the forward one that built it.
            key, _, _ = locate_dispatch_stack(skip=(warnings.__file__,))
            self.syncs[key] += 1
            return
        self._passed_on(message, category, filename, lineno, file, line)

    def __enter__(self) -> RealSyncs:
        with contextlib.ExitStack() as stack:
            stack.enter_context(eager_stance())  # as under the hazard counter: both read the same program
            stack.enter_context(torch.autograd.set_detect_anomaly(True, check_nan=False))
            stack.enter_context(warnings.catch_warnings())
            self._passed_on = warnings.showwarning
            warnings.filterwarnings("always", message=f".*{CUDA_SYNC_WARNING}")
            warnings.showwarning = self._show
            stack.enter_context(self._stall)
            stack.callback(self._cuda.set_sync_debug_mode, self._cuda.get_sync_debug_mode())
            self._cuda.set_sync_debug_mode("warn")
            self._stack = stack.pop_all()
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._stack is not None:
            stack, self._stack = self._stack, None
            stack.close()

    def per_line(self, steps: int) -> dict[tuple[str, int], tuple[float, float]]:
        """{(path, line): (real syncs per step, stall ms per step)} over ``steps`` steps."""
        found: dict[tuple[str, int], tuple[float, float]] = {}
        for key in set(self.syncs) | set(self._stall.seconds):
            where = (key[0], key[1]) if key is not None else ("", 0)
            syncs, stall = found.get(where, (0.0, 0.0))
            found[where] = (syncs + self.syncs.get(key, 0) / steps,
                            stall + self._stall.seconds.get(key, 0.0) * 1e3 / steps)
        return found

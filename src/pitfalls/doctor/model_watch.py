"""What the model and the optimizers do during the scanned steps, for the model's rules (`rules.model`, and
`rules.settings`' cuDNN benchmark; docs/doctor.md, "The rules").
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.conv import _ConvNd
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.utils._python_dispatch import TorchDispatchMode

from pitfalls.doctor.definitions import Definitions
from pitfalls.probes.hostcopy import Provenance
from pitfalls.probes.sites import locate_dispatch

__all__ = ["ModelWatch"]

_aten = torch.ops.aten
# Each matmul op and the positions of its two matrices (addmm's first argument is the bias).
_MATMULS = {_aten.mm: (0, 1), _aten.bmm: (0, 1), _aten.addmm: (1, 2), _aten.baddbmm: (1, 2), _aten.addbmm: (1, 2)}
_CONVOLUTIONS = frozenset({_aten.convolution, _aten.convolution_backward})
_HALF = (torch.float16, torch.bfloat16)
_Key = tuple[str, int, str] | None


def _tf32_device(tensor: torch.Tensor) -> bool:
    """Whether the tensor's device would run float32 on TF32 tensor cores: any device of a CPU run (it stands for
    the GPU program's), a CUDA device of compute capability 8.0 or later."""
    if tensor.device.type != "cuda":
        return True
    return torch.cuda.get_device_capability(tensor.device) >= (8, 0)


class ModelWatch(TorchDispatchMode):
    """Watch the model and the optimizers during the scanned steps; what it saw stays in its attributes after the
    block. As a dispatch mode it sees the dtypes and shapes of matmuls and convolutions below autocast.

    Args:
        definitions: where the script made its optimizers and convolutions.
        provenance: the host-made tensors, to leave out a matmul of host data alone.
    """

    def __init__(self, definitions: Definitions, provenance: Provenance) -> None:
        super().__init__()
        self.definitions = definitions
        self._provenance = provenance
        self.matmuls: Counter[_Key] = Counter()  # float32 without TF32
        self.convolutions: Counter[_Key] = Counter()
        # The forward convolutions run with cudnn.benchmark off: how often each of their shapes ran, by line.
        self.untuned: dict[_Key, Counter[str]] = {}
        self.unaligned: dict[_Key, list[str]] = {}  # the shapes of each half-precision matmul, by line
        self.zero_grads: Counter[_Key] = Counter()
        self.conv_bias: Counter[int] = Counter()
        self.convs: dict[int, _ConvNd] = {}
        self._conv_outputs: dict[int, tuple[weakref.ref[torch.Tensor], int]] = {}
        self.optimizers: dict[int, tuple[weakref.ref[torch.optim.Optimizer], int]] = {}  # id -> (it, its steps)
        self._undo = contextlib.ExitStack()

    # -- what the instruments see ---------------------------------------------------------------------------------

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204 (torch's protocol)
        packet = func.overloadpacket
        if packet in _MATMULS:
            first, second = _MATMULS[packet]
            self._matmul(args[first], args[second])
        elif packet in _CONVOLUTIONS:
            self._convolution(args[0], args[1])
            if packet is _aten.convolution and not torch.backends.cudnn.benchmark:
                self._untuned(args)
        return func(*args, **(kwargs or {}))

    def _matmul(self, a: object, b: object) -> None:
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return
        if self._provenance.on_host(a) and self._provenance.on_host(b):
            return  # host data alone: a matmul on the host in the GPU program too
        if a.dtype == torch.float32 and torch.get_float32_matmul_precision() == "highest" and _tf32_device(a):
            self.matmuls[locate_dispatch()[0]] += 1
        elif a.dtype in _HALF:
            sizes = [size for t in (a, b) for size in t.shape[-2:]]
            if any(size % 8 for size in sizes):
                shapes = f"{str(a.dtype).removeprefix('torch.')} {tuple(a.shape)} @ {tuple(b.shape)}"
                self.unaligned.setdefault(locate_dispatch()[0], []).append(shapes)

    def _convolution(self, x: object, weight: object) -> None:
        if isinstance(x, torch.Tensor) and isinstance(weight, torch.Tensor) and x.dtype == torch.float32 \
                and not torch.backends.cudnn.allow_tf32 and _tf32_device(x):
            self.convolutions[locate_dispatch()[0]] += 1

    def _untuned(self, args: tuple[Any, ...]) -> None:
        x, weight = args[0], args[1]
        if isinstance(x, torch.Tensor) and isinstance(weight, torch.Tensor) and not (
                self._provenance.on_host(x) and self._provenance.on_host(weight)):
            # The input's and the weight's shapes and dtype, and the stride, padding, dilation and groups.
            shapes = f"{tuple(x.shape)} {tuple(weight.shape)} {x.dtype} {args[3:]}"
            self.untuned.setdefault(locate_dispatch()[0], Counter())[shapes] += 1

    def _module_ran(self, module: torch.nn.Module, _args: object, output: object) -> None:
        if isinstance(module, _ConvNd) and module.bias is not None and isinstance(output, torch.Tensor):
            if len(self._conv_outputs) > 256:  # only a conv's latest outputs can go straight into a BatchNorm
                self._conv_outputs = {k: v for k, v in self._conv_outputs.items() if v[0]() is not None}
            self.convs[id(module)] = module
            self._conv_outputs[id(output)] = (weakref.ref(output), id(module))

    def _module_starts(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        if isinstance(module, _BatchNorm) and args and isinstance(args[0], torch.Tensor):
            entry = self._conv_outputs.get(id(args[0]))
            if entry is not None and entry[0]() is args[0]:
                self.conv_bias[entry[1]] += 1

    def _optimizer_steps(self, optimizer: torch.optim.Optimizer, _args: object, _kwargs: object) -> None:
        steps = self.optimizers.get(id(optimizer), (weakref.ref(optimizer), 0))[1]
        self.optimizers[id(optimizer)] = (weakref.ref(optimizer), steps + 1)

    def _zero_grad(self, original: Callable[..., Any]) -> Callable[..., Any]:
        watch = self

        @functools.wraps(original)
        def zero_grad(obj: Any, *args: Any, **kwargs: Any) -> Any:
            if not kwargs.get("set_to_none", args[0] if args else True):
                watch.zero_grads[locate_dispatch()[0]] += 1
            return original(obj, *args, **kwargs)

        return zero_grad

    # -- on and off -------------------------------------------------------------------------------------------------

    def __enter__(self) -> ModelWatch:
        modules = torch.nn.modules.module
        for handle in (modules.register_module_forward_hook(self._module_ran),
                       modules.register_module_forward_pre_hook(self._module_starts),
                       register_optimizer_step_pre_hook(self._optimizer_steps)):
            self._undo.callback(handle.remove)
        for cls in (torch.optim.Optimizer, torch.nn.Module):
            original = cls.zero_grad
            cls.zero_grad = self._zero_grad(original)  # type: ignore[method-assign]
            self._undo.callback(setattr, cls, "zero_grad", original)
        return super().__enter__()

    def __exit__(self, *exc_info: object) -> None:
        super().__exit__(*exc_info)
        self._undo.close()

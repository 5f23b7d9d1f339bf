"""The peers' rules (`RULES`: PyTorch's profiler pattern matcher, Nsight Systems' expert rules), read on a CPU during
the scanned steps from the program itself, each a finding at its line with its fix and its source (docs/doctor.md,
"The rules"): optimizers' settings through torch.optim's step hooks, ``zero_grad`` calls by wrapping it, a
convolution into a BatchNorm by global module hooks, the dtypes and shapes reaching matmul and convolution by a
dispatch mode below autocast. The copies' rules are read by the copy recorder and the hazard counter.
"""

from __future__ import annotations

import functools
import weakref
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.conv import _ConvNd
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.utils._python_dispatch import TorchDispatchMode

from pitfalls.doctor.report import Finding, line_fields
from pitfalls.probes.hostcopy import Provenance
from pitfalls.probes.sites import SourceLine, locate_dispatch, source_line

__all__ = ["CONV_BIAS", "FACTORY_COPY", "FOREACH", "PAGEABLE_COPY", "RULES", "SYNC_COPY", "TF32_CONV", "TF32_MATMUL",
           "UNALIGNED", "ZERO_GRAD", "Definitions", "Rule", "RuleWatch"]

_MATCHER = "PyTorch's profiler pattern matcher (torch.profiler._pattern_matcher)"


@dataclass(frozen=True)
class Rule:
    """One rule: its short name (a finding's ``rule``), what it finds, the fix, the peer's rule it follows
    (``source``), and where the doctor reads it ("CPU or GPU", or what only a GPU shows)."""

    name: str
    finds: str
    fix: str
    source: str
    where: str = "CPU or GPU"


FOREACH = Rule(
    "optimizer tensor by tensor",
    "an optimizer that runs tensor by tensor on a GPU: foreach=False (or differentiable=True) and not fused",
    "leave foreach unset (on a GPU torch picks the foreach implementation) or pass foreach=True; fused=True for "
    "Adam, AdamW and SGD",
    f"{_MATCHER}: OptimizerSingleTensorPattern")
ZERO_GRAD = Rule(
    "zero_grad to zeros",
    "zero_grad(set_to_none=False): a fill of every gradient each step, and an add into it at the next backward",
    "zero_grad() (set_to_none=True, the default since torch 2.0): the next backward writes the gradients afresh",
    f"{_MATCHER}: GradNotSetToNonePattern")
CONV_BIAS = Rule(
    "conv bias before BatchNorm",
    "a convolution with a bias whose output goes straight into a BatchNorm, which subtracts the mean and so "
    "cancels the bias",
    "bias=False in the convolution (at the line that defines it)",
    f"{_MATCHER}: Conv2dBiasFollowedByBatchNorm2dPattern (any Conv*d into any BatchNorm*d here)")
TF32_MATMUL = Rule(
    "float32 matmul without TF32",
    "float32 matmuls while torch.get_float32_matmul_precision() is 'highest' (the default): full-precision "
    "float32 on GPUs whose tensor cores do TF32",
    "torch.set_float32_matmul_precision('high') once, before the loop: TF32 tensor cores on Ampere and later GPUs",
    f"{_MATCHER}: FP32MatMulPattern", "CPU or GPU; costs only on a GPU of compute capability 8.0 or later")
TF32_CONV = Rule(
    "float32 conv without TF32",
    "float32 convolutions while torch.backends.cudnn.allow_tf32 is False (it is True by default)",
    "torch.backends.cudnn.allow_tf32 = True (the default)",
    f"{_MATCHER}: FP32MatMulPattern, for cuDNN's convolutions", "CPU or GPU; costs only on a GPU of compute "
    "capability 8.0 or later")
UNALIGNED = Rule(
    "half-precision size not a multiple of 8",
    "fp16 or bf16 matmuls with a size (of either matrix's last two dimensions) that is not a multiple of 8: "
    "tensor cores work in tiles of 8",
    "pad the size to a multiple of 8 (a vocabulary to a multiple of 64, as nanoGPT does; the batch, the hidden "
    "width)",
    f"{_MATCHER}: MatMulDimInFP16Pattern (bf16 too here)",
    "CPU or GPU; an autocast region for CUDA casts only on a GPU")
FACTORY_COPY = Rule(
    "host fill copied to the device",
    "a tensor a factory (torch.randn, zeros, arange, tensor, ...) fills on the host each step, then copied to the "
    "device (a sync when blocking)",
    "make it on the device: the factory with device=device (a batch instead gets pinned memory and "
    "non_blocking=True)",
    f"{_MATCHER}: ExtraCUDACopyPattern")
PAGEABLE_COPY = Rule(
    "non-blocking copy from pageable memory",
    "a non-blocking copy between host and pageable memory: the driver stages it, so it does not overlap the step",
    "pin the host memory: DataLoader(pin_memory=True), .pin_memory(), or torch.empty(..., pin_memory=True)",
    "Nsight Systems' expert rules: async memcpy with pageable memory")
SYNC_COPY = Rule(
    "blocking copy",
    "a copy between host and device without non_blocking (and .item(), .tolist(), .cpu()): the host waits for the "
    "device",
    "keep the value on the device, or copy without waiting from pinned memory",
    "Nsight Systems' expert rules: synchronous memcpy and memset")
RULES = (FOREACH, ZERO_GRAD, CONV_BIAS, TF32_MATMUL, TF32_CONV, UNALIGNED, FACTORY_COPY, PAGEABLE_COPY, SYNC_COPY)

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


class Definitions:
    """Record the line that made each optimizer and each convolution while the block runs, for the rules that name
    a definition.

    `torch.optim.Optimizer.__init__` and `torch.nn.modules.conv._ConvNd.__init__` (every optimizer's and every
    convolution's, however subclassed) are wrapped for the run and restored after it; each object made is kept weakly
    with the script's line that made it (the innermost frame outside torch and the doctor). The optimizers' wrapper
    also says whether the script made any optimizer, which decides how its steps are counted (`steps.StepCounter`).
    """

    def __init__(self) -> None:
        self._lines: dict[int, tuple[weakref.ref[Any], SourceLine | None]] = {}
        self._saved: list[tuple[type, Callable[..., None]]] = []
        self.optimizers_made = False

    def _wrap(self, cls: type, on_made: Callable[[], None] = lambda: None) -> None:
        original = cls.__init__  # type: ignore[misc]
        definitions = self

        @functools.wraps(original)
        def init(obj: Any, *args: Any, **kwargs: Any) -> None:
            on_made()
            original(obj, *args, **kwargs)
            definitions._lines[id(obj)] = (weakref.ref(obj), source_line(locate_dispatch()[0]))

        self._saved.append((cls, original))
        cls.__init__ = init  # type: ignore[misc]

    def __enter__(self) -> Definitions:
        self._wrap(torch.optim.Optimizer, lambda: setattr(self, "optimizers_made", True))
        self._wrap(_ConvNd)
        return self

    def __exit__(self, *exc_info: object) -> None:
        for cls, original in reversed(self._saved):
            cls.__init__ = original
        self._saved = []

    def line_of(self, obj: object) -> SourceLine | None:
        """The script's line that made an optimizer or a convolution, or None when it was made elsewhere."""
        entry = self._lines.get(id(obj))
        return entry[1] if entry is not None and entry[0]() is obj else None


class RuleWatch(TorchDispatchMode):
    """Read the rules during the scanned steps; `findings(steps)` after the block. As a dispatch mode it sees the
    dtypes and shapes of matmuls and convolutions below autocast.

    Args:
        definitions: where the script made its optimizers and convolutions.
        provenance: the host-made tensors, to leave out matmuls of host data.
    """

    def __init__(self, definitions: Definitions, provenance: Provenance) -> None:
        super().__init__()
        self._definitions = definitions
        self._provenance = provenance
        self.matmuls: Counter[_Key] = Counter()  # float32 without TF32
        self.convolutions: Counter[_Key] = Counter()
        self.unaligned: dict[_Key, list[str]] = {}  # the shapes of each half-precision matmul, by line
        self.zero_grads: Counter[_Key] = Counter()
        self.conv_bias: Counter[int] = Counter()
        self._convs: dict[int, _ConvNd] = {}
        self._conv_outputs: dict[int, tuple[weakref.ref[torch.Tensor], int]] = {}
        self._optimizers: dict[int, tuple[weakref.ref[torch.optim.Optimizer], int]] = {}
        self._undo: list[Callable[[], None]] = []

    # -- what the instruments see ---------------------------------------------------------------------------------

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204 (torch's protocol)
        packet = func.overloadpacket
        if packet in _MATMULS:
            first, second = _MATMULS[packet]
            self._matmul(args[first], args[second])
        elif packet in _CONVOLUTIONS:
            self._convolution(args[0], args[1])
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

    def _module_ran(self, module: torch.nn.Module, _args: object, output: object) -> None:
        if isinstance(module, _ConvNd) and module.bias is not None and isinstance(output, torch.Tensor):
            if len(self._conv_outputs) > 256:  # only a conv's latest outputs can go straight into a BatchNorm
                self._conv_outputs = {k: v for k, v in self._conv_outputs.items() if v[0]() is not None}
            self._convs[id(module)] = module
            self._conv_outputs[id(output)] = (weakref.ref(output), id(module))

    def _module_starts(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        if isinstance(module, _BatchNorm) and args and isinstance(args[0], torch.Tensor):
            entry = self._conv_outputs.get(id(args[0]))
            if entry is not None and entry[0]() is args[0]:
                self.conv_bias[entry[1]] += 1

    def _optimizer_steps(self, optimizer: torch.optim.Optimizer, _args: object, _kwargs: object) -> None:
        steps = self._optimizers.get(id(optimizer), (weakref.ref(optimizer), 0))[1]
        self._optimizers[id(optimizer)] = (weakref.ref(optimizer), steps + 1)

    def _zero_grad(self, original: Callable[..., Any]) -> Callable[..., Any]:
        watch = self

        @functools.wraps(original)
        def zero_grad(obj: Any, *args: Any, **kwargs: Any) -> Any:
            if not kwargs.get("set_to_none", args[0] if args else True):
                watch.zero_grads[locate_dispatch()[0]] += 1
            return original(obj, *args, **kwargs)

        return zero_grad

    # -- on and off -------------------------------------------------------------------------------------------------

    def __enter__(self) -> RuleWatch:
        modules = torch.nn.modules.module
        handles = [modules.register_module_forward_hook(self._module_ran),
                   modules.register_module_forward_pre_hook(self._module_starts),
                   register_optimizer_step_pre_hook(self._optimizer_steps)]
        self._undo = [handle.remove for handle in handles]
        for cls in (torch.optim.Optimizer, torch.nn.Module):
            original = cls.zero_grad
            cls.zero_grad = self._zero_grad(original)  # type: ignore[method-assign]
            self._undo.append(functools.partial(setattr, cls, "zero_grad", original))
        return super().__enter__()

    def __exit__(self, *exc_info: object) -> None:
        super().__exit__(*exc_info)
        for undo in reversed(self._undo):
            undo()
        self._undo = []

    # -- the findings -----------------------------------------------------------------------------------------------

    def findings(self, steps: int, no_cost: str) -> list[Finding]:
        """The rules' findings over ``steps`` scanned steps; ``no_cost`` says why their cost is not measured."""
        if steps == 0:
            return []

        def finding(rule: Rule, title: str, line: SourceLine | None, count: int) -> Finding:
            return Finding(**line_fields(line), kind="rule", title=title, per_step=count / steps,
                           cost=f"not measured: {no_cost}", fix=rule.fix, rule=rule.name)

        found = []
        for ref, count in self._optimizers.values():
            optimizer = ref()
            setting = _tensor_by_tensor(optimizer) if optimizer is not None else ""
            if setting:
                found.append(finding(FOREACH, f"{type(optimizer).__name__} runs tensor by tensor on a GPU ({setting})",
                                     self._definitions.line_of(optimizer), count))
        for module_id, count in self.conv_bias.items():
            module = self._convs[module_id]
            found.append(finding(CONV_BIAS, f"{type(module).__name__} with a bias straight into a BatchNorm",
                                 self._definitions.line_of(module), count))
        found += [finding(ZERO_GRAD, "zero_grad(set_to_none=False)", source_line(key), n)
                  for key, n in self.zero_grads.items()]
        for rule, counts, what in ((TF32_MATMUL, self.matmuls, "float32 matmul"),
                                   (TF32_CONV, self.convolutions, "float32 convolution")):
            if counts:
                # One setting fixes them all: one finding, at the line that runs the most.
                key, _ = counts.most_common(1)[0]
                total = sum(counts.values())
                title = f"{total / steps:g} {what}(s) a step at {len(counts)} line(s), without TF32"
                found.append(finding(rule, title, source_line(key), total))
        for key, shapes in self.unaligned.items():
            title = (f"{len(shapes) / steps:g} half-precision matmul(s) a step with a size not a multiple of 8: "
                     f"{', '.join(dict.fromkeys(shapes))}")
            found.append(finding(UNALIGNED, title, source_line(key), len(shapes)))
        return found


def _tensor_by_tensor(optimizer: torch.optim.Optimizer) -> str:
    """The setting that makes an optimizer run tensor by tensor on a GPU, or "" (foreach or fused there, or an
    optimizer with no foreach implementation to switch to)."""
    if "foreach" not in optimizer.defaults:
        return ""
    for group in optimizer.param_groups:
        if group.get("fused"):
            continue
        if group.get("differentiable"):
            return "differentiable=True"
        if group.get("foreach") is False:
            return "foreach=False"
    return ""

"""The model's rules, PyTorch's profiler pattern matcher's, read on a CPU from the program itself during the scanned
steps (`model_watch.ModelWatch`; docs/doctor.md, "The rules").
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from pitfalls.doctor.model_watch import ModelWatch
from pitfalls.doctor.planted import RULES as SCRIPT
from pitfalls.doctor.records import ScanContext, Seen
from pitfalls.doctor.rule import Hit, Plant, Rule
from pitfalls.probes.sites import source_line

__all__ = ["CONV_BIAS", "FOREACH", "RULES", "TF32_CONV", "TF32_MATMUL", "UNALIGNED", "ZERO_GRAD", "tensor_by_tensor",
           "watch"]

_MATCHER = "PyTorch's profiler pattern matcher (torch.profiler._pattern_matcher)"
_TF32_WHERE = "CPU or GPU; costs only on a GPU of compute capability 8.0 or later"


def watch(context: ScanContext) -> ModelWatch:
    """The model's instrument of the scanned steps."""
    return ModelWatch(context.definitions, context.provenance)


def tensor_by_tensor(optimizer: torch.optim.Optimizer) -> str:
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


def _foreach(seen: Seen) -> list[Hit]:
    model, steps = seen.scanned(watch)
    if model is None:
        return []
    hits = []
    for ref, count in model.optimizers.values():
        optimizer = ref()
        setting = tensor_by_tensor(optimizer) if optimizer is not None else ""
        if setting:
            hits.append(Hit(f"{type(optimizer).__name__} runs tensor by tensor on a GPU ({setting})",
                            model.definitions.line_of(optimizer), count / steps))
    return hits


def _conv_bias(seen: Seen) -> list[Hit]:
    model, steps = seen.scanned(watch)
    if model is None:
        return []
    return [Hit(f"{type(model.convs[key]).__name__} with a bias straight into a BatchNorm",
                model.definitions.line_of(model.convs[key]), count / steps) for key, count in model.conv_bias.items()]


def _zero_grad(seen: Seen) -> list[Hit]:
    model, steps = seen.scanned(watch)
    if model is None:
        return []
    return [Hit("zero_grad(set_to_none=False)", source_line(key), n / steps) for key, n in model.zero_grads.items()]


def _precision(what: str, matmuls: bool) -> Callable[[Seen], list[Hit]]:
    def find(seen: Seen) -> list[Hit]:
        model, steps = seen.scanned(watch)
        if model is None:
            return []
        counts = model.matmuls if matmuls else model.convolutions
        if not counts:
            return []
        # One setting fixes them all: one finding, at the line that runs the most.
        key, _ = counts.most_common(1)[0]
        total = sum(counts.values())
        return [Hit(f"{total / steps:g} {what}(s) a step at {len(counts)} line(s), without TF32", source_line(key),
                    total / steps)]

    return find


def _unaligned(seen: Seen) -> list[Hit]:
    model, steps = seen.scanned(watch)
    if model is None:
        return []
    return [Hit(f"{len(shapes) / steps:g} half-precision matmul(s) a step with a size not a multiple of 8: "
                f"{', '.join(dict.fromkeys(shapes))}", source_line(key), len(shapes) / steps)
            for key, shapes in model.unaligned.items()]


_READS = "the model's watch of the scanned steps: "
FOREACH = Rule(
    "optimizer tensor by tensor", "rule",
    "an optimizer that runs tensor by tensor on a GPU: foreach=False (or differentiable=True) and not fused",
    "leave foreach unset (on a GPU torch picks the foreach implementation) or pass foreach=True; fused=True for "
    "Adam, AdamW and SGD", f"{_MATCHER}: OptimizerSingleTensorPattern",
    _READS + "each optimizer's parameter groups, at its definition line", _foreach,
    Plant.of(SCRIPT, "slow = torch.optim.AdamW(", "fast = torch.optim.AdamW("), watch, gated=True)
ZERO_GRAD = Rule(
    "zero_grad to zeros", "rule",
    "zero_grad(set_to_none=False): a fill of every gradient each step, and an add into it at the next backward",
    "zero_grad() (set_to_none=True, the default since torch 2.0): the next backward writes the gradients afresh",
    f"{_MATCHER}: GradNotSetToNonePattern", _READS + "each zero_grad call", _zero_grad,
    Plant.of(SCRIPT, "slow.zero_grad(set_to_none=False)", "fast.zero_grad()"), watch, gated=True)
CONV_BIAS = Rule(
    "conv bias before BatchNorm", "rule",
    "a convolution with a bias whose output goes straight into a BatchNorm, which subtracts the mean and so cancels "
    "the bias", "bias=False in the convolution (at the line that defines it)",
    f"{_MATCHER}: Conv2dBiasFollowedByBatchNorm2dPattern (any Conv*d into any BatchNorm*d here)",
    _READS + "global module hooks, at the convolution's definition line", _conv_bias,
    Plant.of(SCRIPT, "self.biased = nn.Conv2d(", "self.plain = nn.Conv2d("), watch, gated=True)
TF32_MATMUL = Rule(
    "float32 matmul without TF32", "rule",
    "float32 matmuls while torch.get_float32_matmul_precision() is 'highest' (the default): full-precision float32 "
    "on GPUs whose tensor cores do TF32",
    "torch.set_float32_matmul_precision('high') once, before the loop: TF32 tensor cores on Ampere and later GPUs",
    f"{_MATCHER}: FP32MatMulPattern", _READS + "the dtypes reaching matmul, below autocast",
    _precision("float32 matmul", matmuls=True),
    Plant.of(SCRIPT, "logits = self.head(x)", "target = teacher(smoothed.mean((2, 3)))", cuda=True), watch, _TF32_WHERE,
    gated=True)
TF32_CONV = Rule(
    "float32 conv without TF32", "rule",
    "float32 convolutions while torch.backends.cudnn.allow_tf32 is False (it is True by default)",
    "torch.backends.cudnn.allow_tf32 = True (the default)", f"{_MATCHER}: FP32MatMulPattern, for cuDNN's convolutions",
    _READS + "the dtypes reaching convolution, below autocast",
    _precision("float32 convolution", matmuls=False),
    Plant.of(SCRIPT, "smoothed = blur(images)", "target = teacher(smoothed.mean((2, 3)))"), watch, _TF32_WHERE,
    gated=True)
UNALIGNED = Rule(
    "half-precision size not a multiple of 8", "rule",
    "fp16 or bf16 matmuls with a size (of either matrix's last two dimensions) that is not a multiple of 8: tensor "
    "cores work in tiles of 8",
    "pad the size to a multiple of 8 (a vocabulary to a multiple of 64, as nanoGPT does; the batch, the hidden width)",
    f"{_MATCHER}: MatMulDimInFP16Pattern (bf16 too here)", _READS + "the dtypes and shapes reaching matmul",
    _unaligned, Plant.of(SCRIPT, "odd = self.odd(x)", "even = self.even(x)", cuda=True), watch,
    "CPU or GPU; an autocast region for CUDA casts only on a GPU", gated=True)
RULES = (FOREACH, ZERO_GRAD, CONV_BIAS, TF32_MATMUL, TF32_CONV, UNALIGNED)

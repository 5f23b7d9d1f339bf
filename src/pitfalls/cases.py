"""A case is one runnable workload: a family's variant with its sizes, device and eager/compiled choice.

The asv suite, the pytest-benchmark tests, the probes and the CLI all build their workloads here, so every one
of them measures the same thing on the same seeded inputs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from pitfalls.families import loss, sampler
from pitfalls.devices import cuda_available, fits, resolve_device
from pitfalls.registry import check_variant

DEFAULT_PARAMS: dict[str, dict[str, int]] = {
    "loss": {"batch": 8, "image_size": 64},
    "sampler": {"n": 10_000, "batch": 1, "feature_dim": 16},
}


class SkipCase(Exception):
    """This case cannot run here (no such device, too big for memory); ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Case:
    """One workload, built once; calling it runs one step (loss) or one sampling call (sampler).

    ``fn(*inputs)`` is the eager form of the part ``torch.compile`` wraps (the net's forward plus the loss; the
    sampler), for probes that must see every op. ``call()`` is queued on the device, not synchronized.
    """

    family: str
    variant: str
    device: torch.device
    compiled: bool
    params: dict[str, int]
    call: Callable[[], Any] = field(repr=False)
    fn: Callable[..., Any] = field(repr=False)
    inputs: tuple[torch.Tensor, ...] = field(repr=False)

    def __call__(self) -> Any:
        return self.call()

    @property
    def name(self) -> str:
        mode = "compiled" if self.compiled else "eager"
        sizes = " ".join(f"{k}={v}" for k, v in self.params.items())
        return f"{self.family}/{self.variant} {sizes} {self.device} {mode}"


def estimate_bytes(family: str, params: dict[str, int]) -> int:
    """Estimate the peak bytes of a case from its sizes, before anything is allocated."""
    if family == "loss":
        return loss.estimate_train_step_bytes(params["batch"], params["image_size"])
    return sampler.estimate_sample_bytes(params["n"], params["batch"], params["feature_dim"])


def build_case(family: str, variant: str, *, device: str = "cpu", compiled: bool = False, **params: int) -> Case:
    """Build one case on seeded inputs.

    Args:
        family: ``"loss"`` or ``"sampler"``.
        variant: one of the family's registered variants.
        device: ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
        compiled: wrap the workload in ``torch.compile`` (compiled lazily, on the first call).
        **params: sizes; loss: batch, image_size; sampler: n, batch, feature_dim. Missing ones take defaults.

    Returns:
        The case, ready to call.

    Raises:
        SkipCase: the device is absent or the case would not fit in its memory.
    """
    check_variant(family, variant)
    unknown = set(params) - set(DEFAULT_PARAMS[family])
    if unknown:
        raise ValueError(
            f"{family} has no parameter {', '.join(sorted(unknown))}; allowed: {', '.join(DEFAULT_PARAMS[family])}"
        )
    sizes = {**DEFAULT_PARAMS[family], **params}
    if str(device).startswith("cuda") and not cuda_available():
        raise SkipCase("no CUDA device")
    where = resolve_device(device)
    ok, reason = fits(where, estimate_bytes(family, sizes))
    if not ok:
        raise SkipCase(reason)
    if family == "loss":
        step = loss.make_train_step(
            loss.TrainConfig(variant=variant, device=str(where), compiled=compiled, **sizes)
        )
        return Case(family, variant, where, compiled, sizes, step, step.forward_loss, (step.images, step.labels))
    call = sampler.make_sample_call(sampler.SamplerConfig(variant=variant, device=str(where), compiled=compiled, **sizes))
    return Case(
        family, variant, where, compiled, sizes, call, call.fn, (call.features, call.labels, call.config.num_samples)
    )

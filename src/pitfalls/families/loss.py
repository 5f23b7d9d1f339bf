"""Article 000: a masked cross-entropy whose naive form hides three host-device syncs.

A toy segmentation net is trained with a cross-entropy that (1) turns the background class into the ignore
label, (2) is zeroed when the target holds fewer than two distinct values and (3) skips ignored pixels. The
naive form does each with an op whose output shape depends on the data (``nonzero``, ``unique``, boolean
masks), so on a GPU the host stalls until the device drains. Each later variant removes one such op and keeps
the loss's meaning:

========== ============================ ================================ ==================================
variant    background -> ignore         "fewer than 2 distinct values"   skip ignored pixels
========== ============================ ================================ ==================================
naive      nonzero + index assignment   unique + Python branch           boolean mask on target and logits
where      torch.where                  unique + Python branch           boolean mask
sort_count torch.where                  sort + diff + count_nonzero,     boolean mask
                                        zeroed by torch.where
ignore_idx torch.where                  as sort_count                    CrossEntropyLoss(ignore_index=-1)
========== ============================ ================================ ==================================

The mean is taken over the pixels that are not ignored, and is defined as 0 when every pixel is ignored (a
plain mean would be 0/0 = NaN there, and 0 * NaN is still NaN, so one such batch would poison the weights).

The floor is the same training step with a plain ``F.cross_entropy(ignore_index=-1)`` on targets whose background
was remapped once, before the step: the loss the hardware can do fastest, without the "fewer than 2 distinct"
rule. It is a reference for the variants' times, not a variant: it does not give their answer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pitfalls._checks import (
    check_choice,
    check_dtype,
    check_ndim,
    check_positive_int,
    check_same_device,
    check_tensor,
)
from pitfalls.devices import resolve_device
from pitfalls.family import FLOOR, Case, Comparison, Family, Param

IGNORE = -1


class SegNet(nn.Module):
    """The article's toy segmentation net: conv_in 3->10, ten [conv 10->10, ReLU] blocks, conv_out 10->C.

    Args:
        num_classes: output channels, one per semantic class.
        num_hidden: number of hidden [conv, ReLU] blocks.
    """

    def __init__(self, num_classes: int = 10, num_hidden: int = 10) -> None:
        super().__init__()
        self.conv_in = nn.Conv2d(3, 10, 3, padding="same")
        hidden: list[nn.Module] = []
        for _ in range(num_hidden):
            hidden += [nn.Conv2d(10, 10, 3, padding="same"), nn.ReLU()]
        self.hidden = nn.Sequential(*hidden)
        self.conv_out = nn.Conv2d(10, num_classes, 3, padding="same")

    def forward(self, x: Tensor) -> Tensor:
        """Map images [B, 3, H, W] to per-pixel logits [B, C, H, W]."""
        return self.conv_out(self.hidden(F.relu(self.conv_in(x))))


class MaskedLoss(nn.Module):
    """Shared argument checks and helpers; subclasses implement ``compute`` (one variant each).

    Args:
        num_classes: C; labels lie in [-1, C), -1 is ignored and C-1 is background (also ignored).
    """

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.num_classes = check_positive_int("num_classes", num_classes)
        if num_classes < 2:
            raise ValueError(f"num_classes={num_classes} is not allowed; it must be at least 2")
        self.background = num_classes - 1

    def forward(self, pred: Tensor, target: Tensor) -> Tensor:
        """Return the scalar loss of logits ``pred`` [B, C, H, W] against labels ``target`` [B, H, W] (int64)."""
        # Only metadata is checked: a check of label values would itself sync with the device.
        check_tensor("pred", pred)
        check_tensor("target", target)
        check_dtype("pred", pred, (torch.float16, torch.bfloat16, torch.float32, torch.float64), "logits")
        check_dtype("target", target, (torch.int64,), "labels (what cross_entropy indexes with)")
        check_ndim("pred", pred, (4,), "[B, C, H, W]")
        check_ndim("target", target, (3,), "[B, H, W]")
        b, c, h, w = pred.shape
        if c != self.num_classes:
            raise ValueError(f"pred has {c} channels at dim 1; this loss was built for num_classes={self.num_classes}")
        if tuple(target.shape) != (b, h, w):
            raise ValueError(f"target has shape {tuple(target.shape)}; expected {(b, h, w)} to match pred")
        check_same_device(pred=pred, target=target)
        return self.compute(pred, target)

    def compute(self, pred: Tensor, target: Tensor) -> Tensor:
        raise NotImplementedError

    def masked_cross_entropy(self, pred: Tensor, target: Tensor) -> Tensor:
        """Mean cross-entropy over the pixels that are not ignored, selected with boolean masks."""
        mask = target != IGNORE
        # Boolean indexing has a data-dependent output shape: the host waits for the device to count the mask.
        masked_target = target[mask]
        masked_pred = pred.permute(0, 2, 3, 1)[mask]
        total = F.cross_entropy(masked_pred, masked_target, reduction="sum")
        return total / max(masked_target.numel(), 1)

    def background_to_ignore(self, target: Tensor) -> Tensor:
        """Return a new target with the background class turned into the ignore label, without a sync."""
        return torch.where(target == self.background, torch.full_like(target, IGNORE), target)

    @staticmethod
    def count_distinct(target: Tensor) -> Tensor:
        """Count distinct labels as a device tensor: the steps of the sorted labels, plus one."""
        ordered, _ = torch.sort(target.flatten())
        return torch.count_nonzero(ordered[1:] - ordered[:-1]) + 1


class NaiveLoss(MaskedLoss):
    """The article's starting point: three ops with data-dependent shapes, each a host-device sync."""

    def compute(self, pred: Tensor, target: Tensor) -> Tensor:
        # The article writes into the caller's target; copy so a benchmark loop sees the same labels each call.
        target = target.clone()
        background = torch.nonzero(target == self.background, as_tuple=True)
        target[background] = IGNORE
        too_few_labels = torch.unique(target).numel() < 2
        loss = self.masked_cross_entropy(pred, target)
        if too_few_labels:
            loss = 0.0 * loss
        return loss


class WhereLoss(MaskedLoss):
    """Optimization 1: the background remap by ``torch.where``; ``unique`` and the masks still sync."""

    def compute(self, pred: Tensor, target: Tensor) -> Tensor:
        target = self.background_to_ignore(target)
        too_few_labels = torch.unique(target).numel() < 2
        loss = self.masked_cross_entropy(pred, target)
        if too_few_labels:
            loss = 0.0 * loss
        return loss


class SortCountLoss(MaskedLoss):
    """Optimization 2: distinct labels counted on the device, the loss zeroed by ``torch.where``."""

    def compute(self, pred: Tensor, target: Tensor) -> Tensor:
        target = self.background_to_ignore(target)
        num_distinct = self.count_distinct(target)
        loss = self.masked_cross_entropy(pred, target)
        return torch.where(num_distinct < 2, 0.0 * loss, loss)


class IgnoreIndexLoss(MaskedLoss):
    """Optimization 3: ``CrossEntropyLoss(ignore_index=-1)`` on the unmasked tensors; no sync is left."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__(num_classes)
        # Summed, then divided by a count clamped to 1, so an all-ignored batch gives 0 rather than 0/0.
        self.cross_entropy = nn.CrossEntropyLoss(ignore_index=IGNORE, reduction="sum")

    def compute(self, pred: Tensor, target: Tensor) -> Tensor:
        target = self.background_to_ignore(target)
        num_distinct = self.count_distinct(target)
        num_valid = (target != IGNORE).sum().clamp_min(1)
        loss = self.cross_entropy(pred, target) / num_valid
        return torch.where(num_distinct < 2, 0.0 * loss, loss)


VARIANTS: dict[str, type[MaskedLoss]] = {
    "naive": NaiveLoss,
    "where": WhereLoss,
    "sort_count": SortCountLoss,
    "ignore_index": IgnoreIndexLoss,
}


class FloorLoss(nn.Module):
    """The floor's loss: plain cross-entropy with ``ignore_index``, on targets remapped before the step."""

    def forward(self, pred: Tensor, target: Tensor) -> Tensor:
        return F.cross_entropy(pred, target, ignore_index=IGNORE)


def make_loss(variant: str, num_classes: int = 10) -> MaskedLoss:
    """Build the masked loss module of one variant.

    Args:
        variant: one of ``VARIANTS`` (naive, where, sort_count, ignore_index).
        num_classes: C, the number of classes including the background class C-1.

    Returns:
        A module called as ``loss(pred, target)`` returning a scalar tensor.
    """
    return VARIANTS[check_choice("variant", variant, VARIANTS)](num_classes)


@dataclass(frozen=True)
class TrainConfig:
    """One training-step case: which loss (a variant or the floor), how big, where, eager or compiled."""

    variant: str = "naive"
    batch: int = 8
    image_size: int = 64
    num_classes: int = 10
    device: str = "cpu"
    compiled: bool = False
    seed: int = 0
    lr: float = 1e-3
    momentum: float = 0.9

    def __post_init__(self) -> None:
        check_choice("variant", self.variant, (*VARIANTS, FLOOR))
        check_positive_int("batch", self.batch)
        check_positive_int("image_size", self.image_size)
        check_positive_int("num_classes", self.num_classes)


def estimate_train_step_bytes(batch: int, image_size: int, num_classes: int = 10, num_hidden: int = 10) -> int:
    """Estimate the peak bytes of one training step, before allocating anything.

    Counts the inputs, every activation kept for backward (two 10-channel maps per hidden block), their
    gradients, and the logits with the loss's copies of them; float32 everywhere, int64 labels.
    """
    pixels = batch * image_size * image_size
    activations = 4 * 10 * (2 * num_hidden + 2)
    logits = 4 * num_classes * 4
    inputs = 4 * 3 + 8 * 3
    return pixels * (inputs + 2 * activations + logits)


def seeded_batch(
    batch: int, image_size: int, num_classes: int, device: torch.device, seed: int
) -> tuple[Tensor, Tensor]:
    """Return the article's random inputs: images ``randn(B,3,H,W)``, labels ``randint(-1, C, (B,H,W))``."""
    generator = torch.Generator().manual_seed(seed)
    # Drawn on the host so every device and torch build sees the same numbers.
    images = torch.randn(batch, 3, image_size, image_size, generator=generator)
    labels = torch.randint(IGNORE, num_classes, (batch, image_size, image_size), generator=generator)
    return images.to(device), labels.to(device)


class TrainStep:
    """One SGD(momentum) training step of SegNet with a variant's loss, on inputs built once.

    Call it with no arguments; it returns the step's loss (detached). The step is queued on the device and not
    synchronized: the caller's timer decides when to wait.
    """

    def __init__(self, config: TrainConfig) -> None:
        self.config = config
        self.device = resolve_device(config.device)
        torch.manual_seed(config.seed)
        self.model = SegNet(config.num_classes).to(self.device)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=config.lr, momentum=config.momentum)
        self.images, self.labels = seeded_batch(
            config.batch, config.image_size, config.num_classes, self.device, config.seed
        )
        self.loss_fn: nn.Module
        if config.variant == FLOOR:
            self.loss_fn = FloorLoss()
            # Remapped once here, outside the step: the floor pays for no label logic at all.
            self.labels = MaskedLoss(config.num_classes).background_to_ignore(self.labels)
        else:
            self.loss_fn = make_loss(config.variant, config.num_classes).to(self.device)
        self.forward: Callable[[Tensor, Tensor], Tensor] = self.forward_loss
        if config.compiled:
            self.forward = torch.compile(self.forward_loss)

    def forward_loss(self, images: Tensor, labels: Tensor) -> Tensor:
        """Logits of the net, then the variant's loss: the part that ``torch.compile`` sees."""
        return self.loss_fn(self.model(images), labels)

    def __call__(self) -> Tensor:
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.forward(self.images, self.labels)
        loss.backward()
        self.optimizer.step()
        return loss.detach()


def make_train_step(config: TrainConfig) -> TrainStep:
    """Build a training step for one case.

    Args:
        config: variant, batch, image size, classes, device, compiled, seed and optimizer settings.

    Returns:
        A zero-argument callable running one step and returning its loss.
    """
    return TrainStep(config)


def loss_inputs(seed: int = 0) -> Iterator[tuple[str, Tensor, Tensor]]:
    """Yield small seeded (name, logits, labels) sets on the host, the edge cases among them."""
    generator = torch.Generator().manual_seed(seed)
    b, c, h, w = 2, 10, 12, 12
    pred = torch.randn(b, c, h, w, generator=generator)
    yield "random labels", pred, torch.randint(-1, c, (b, h, w), generator=generator)
    yield "one distinct label", pred, torch.full((b, h, w), 3)
    yield "only ignore and background", pred, torch.randint(0, 2, (b, h, w), generator=generator) * c - 1
    yield "no background", pred, torch.randint(-1, c - 1, (b, h, w), generator=generator)


def value_and_grad(variant: str, pred: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
    """Return a loss variant's value and its gradient with respect to the logits."""
    pred = pred.detach().clone().requires_grad_(True)
    value = make_loss(variant, pred.shape[1])(pred, target)
    (grad,) = torch.autograd.grad(value, pred)
    return value.detach(), grad


def compare(family: Family, variant: str, device: torch.device) -> Comparison:
    """Compare one loss variant with ``naive`` in value and gradient over every input set."""
    worst, failed = 0.0, []
    for name, pred, target in loss_inputs():
        pred, target = pred.to(device), target.to(device)
        want_value, want_grad = value_and_grad(family.baseline, pred, target)
        value, grad = value_and_grad(variant, pred, target)
        diff = max((value - want_value).abs().item(), (grad - want_grad).abs().max().item())
        worst = max(worst, diff)
        close = torch.allclose(value, want_value, rtol=1e-5, atol=1e-6) and torch.allclose(
            grad, want_grad, rtol=1e-5, atol=1e-7
        )
        if not close:
            failed.append(name)
    return Comparison(family.name, variant, str(device), not failed, worst, ", ".join(failed))


def build(variant: str, device: torch.device, compiled: bool, params: dict[str, Any]) -> Case:
    """One training step of a variant (or the floor) as a case; ``fn`` is the forward pass and the loss."""
    step = make_train_step(TrainConfig(variant=variant, device=str(device), compiled=compiled, **params))
    return Case(FAMILY.name, variant, device, compiled, params, step, step.forward_loss, (step.images, step.labels))


def estimate(params: Mapping[str, Any]) -> int:
    return estimate_train_step_bytes(params["batch"], params["image_size"])


FAMILY = Family(
    name="loss",
    article="000",
    summary="masked cross-entropy: nonzero, unique and boolean masks sync the host with the device",
    variants=tuple(VARIANTS),
    params=(
        Param("batch", 8, "images per training step"),
        Param("image_size", 64, "image height and width, in pixels"),
    ),
    builder=build,
    estimate=estimate,
    comparer=compare,
    smoke={"batch": 2, "image_size": 16},
    grids={
        "quick": {"batch": (4,), "image_size": (64,)},
        # The article's size is batch 256 at 256x256 (1.3 s -> 5.4 ms per step on an A10G).
        "full": {"batch": (4, 32, 256), "image_size": (64, 256)},
    },
    article_sizes=({"batch": 256, "image_size": 256},),
    unit="step",
)

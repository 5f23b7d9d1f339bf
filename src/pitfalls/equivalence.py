"""Does each optimized variant give the naive variant's answer? The gate every benchmark stands on.

The loss is deterministic, so variants must agree in value and gradient. The sampler is random, so variants
must agree in what is determined (how many positives and negatives each row gets) and each must obey the
rules (distinct picks, of the right class, features matching their labels); tests add the distribution.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from pitfalls.families import loss, sampler
from pitfalls.devices import resolve_device
from pitfalls.registry import baseline, families, variants


@dataclass(frozen=True)
class Comparison:
    """One variant on one device against its family's naive variant."""

    family: str
    variant: str
    device: str
    matches: bool
    max_abs_diff: float
    detail: str = ""


def loss_inputs(device: torch.device, seed: int = 0) -> Iterator[tuple[str, Tensor, Tensor]]:
    """Yield small seeded (name, logits, labels) sets, the edge cases among them."""
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
    value = loss.make_loss(variant, pred.shape[1])(pred, target)
    (grad,) = torch.autograd.grad(value, pred)
    return value.detach(), grad


def compare_loss(variant: str, device: torch.device) -> Comparison:
    """Compare one loss variant with ``naive`` in value and gradient over every input set."""
    worst, failed = 0.0, []
    for name, pred, target in loss_inputs(device):
        pred, target = pred.to(device), target.to(device)
        want_value, want_grad = value_and_grad(baseline("loss"), pred, target)
        value, grad = value_and_grad(variant, pred, target)
        diff = max((value - want_value).abs().item(), (grad - want_grad).abs().max().item())
        worst = max(worst, diff)
        close = torch.allclose(value, want_value, rtol=1e-5, atol=1e-6) and torch.allclose(
            grad, want_grad, rtol=1e-5, atol=1e-7
        )
        if not close:
            failed.append(name)
    return Comparison("loss", variant, str(device), not failed, worst, ", ".join(failed))


def sample_violations(result: sampler.SampleResult, features: Tensor, labels: Tensor) -> list[str]:
    """List how a sampling result breaks the rules (empty when it obeys them); inputs are one row or a batch."""
    problems = []
    rows = labels.reshape(-1, labels.shape[-1])
    row_features = features.reshape(-1, *features.shape[-2:])
    picked_rows = result.labels.reshape(rows.shape[0], -1)
    valid_rows = result.valid.reshape(rows.shape[0], -1)
    picked_feature_rows = result.features.reshape(rows.shape[0], -1, features.shape[-1])
    for i in range(rows.shape[0]):
        valid = valid_rows[i]
        picked = picked_feature_rows[i][valid]
        # Features are random normal, so matching a row of the input identifies the picked item.
        matches = (picked.unsqueeze(1) == row_features[i].unsqueeze(0)).all(-1)
        if not bool(matches.any(1).all()):
            problems.append(f"row {i}: a picked feature vector is not in the input")
            continue
        idx = matches.float().argmax(1)
        if idx.unique().numel() != idx.numel():
            problems.append(f"row {i}: an item was picked twice")
        if not bool((rows[i][idx] == picked_rows[i][valid]).all()):
            problems.append(f"row {i}: labels do not match the picked features")
        if not bool(((picked_rows[i][valid] == 0) | (picked_rows[i][valid] == 1)).all()):
            problems.append(f"row {i}: an item of neither class was picked")
    return problems


def class_counts(result: sampler.SampleResult, batch_shape: tuple[int, ...]) -> Tensor:
    """Return per-row (positives, negatives) among the valid picks, shape [rows, 2]."""
    labels = result.labels.reshape(*batch_shape, -1)
    valid = result.valid.reshape(*batch_shape, -1)
    positives = ((labels == sampler.POSITIVE) & valid).sum(-1)
    negatives = ((labels == sampler.NEGATIVE) & valid).sum(-1)
    return torch.stack([positives, negatives], -1).reshape(-1, 2)


def sampler_inputs(device: torch.device, seed: int = 0) -> Iterator[tuple[str, Tensor, Tensor, int]]:
    """Yield small seeded (name, features, labels, K) sets, the short-class edge cases among them."""
    generator = torch.Generator().manual_seed(seed)
    n, d = 200, 4
    features = torch.randn(4, n, d, generator=generator)
    labels = torch.randint(-1, 2, (4, n), generator=generator)
    labels[1] = torch.where(labels[1] == 1, 0, labels[1])  # no positives
    labels[2, 10:] = -1  # fewer eligible items than K
    yield "batch of mixed rows", features, labels, 40
    yield "one row", features[0], labels[0], 40
    yield "N < K", features[3, :30], labels[3, :30], 40


def compare_sampler(variant: str, device: torch.device) -> Comparison:
    """Compare one sampler variant with ``nonzero``: per-row class counts, and the rules on its own picks."""
    worst, failed = 0.0, []
    torch.manual_seed(0)
    for name, features, labels, k in sampler_inputs(device):
        features, labels = features.to(device), labels.to(device)
        batch_shape = tuple(labels.shape[:-1]) or (1,)
        want = class_counts(sampler.sample(baseline("sampler"), features, labels, k), batch_shape)
        got_result = sampler.sample(variant, features, labels, k)
        got = class_counts(got_result, batch_shape)
        worst = max(worst, float((got - want).abs().max().item()))
        problems = sample_violations(got_result, features, labels)
        if problems or not torch.equal(got, want):
            failed.append(name + (f" ({problems[0]})" if problems else " (class counts differ)"))
    return Comparison("sampler", variant, str(device), not failed, worst, ", ".join(failed))


COMPARERS = {"loss": compare_loss, "sampler": compare_sampler}


def check_all(devices: tuple[str, ...]) -> list[Comparison]:
    """Compare every registered variant of every family with its naive variant on each device."""
    return [
        COMPARERS[name](variant, resolve_device(device))
        for device in devices
        for name in families()
        for variant in variants(name)
    ]

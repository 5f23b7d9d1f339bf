"""Article 004: a balanced positive/negative sampler, with dynamic shapes (naive) and static shapes.

From N labelled items pick K (``num_samples``): K/2 positives (label 1) and K/2 negatives (label 0), the other
class filling the gap when one is short; any other label is never picked. ``nonzero`` follows Detectron2's
sampler, whose output length the host learns only once the device has counted (a sync per row, no single graph);
``static`` keeps every shape fixed: K slots and a ``valid`` mask, a whole batch in one call. The floor is one
``topk`` over N random keys, a reference, not a variant. The rule and how it departs from Detectron2's:
docs/families/sampler.md.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor

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

POSITIVE = 1
NEGATIVE = 0
INVALID_LABEL = -1


class SampleResult(NamedTuple):
    """Sampled features [..., S, D], their labels [..., S] and which slots hold a real pick [..., S].

    Slots that hold no pick (only when fewer than K items are eligible) have zero features, label -1 and
    ``valid`` False.
    """

    features: Tensor
    labels: Tensor
    valid: Tensor


def nonzero_sample(features: Tensor, labels: Tensor, num_samples: int) -> SampleResult:
    """Detectron2-style sampling of one row [N, D] / [N]; returns ``pos + neg`` picks, all valid."""
    half = num_samples // 2
    # nonzero's output length is data-dependent: each call makes the host wait for the device.
    positive = torch.nonzero(labels == POSITIVE, as_tuple=True)[0]
    negative = torch.nonzero(labels == NEGATIVE, as_tuple=True)[0]
    num_pos = min(positive.numel(), half)
    num_neg = min(negative.numel(), half)
    if num_neg < half:
        num_pos = min(positive.numel(), num_samples - num_neg)
    elif num_pos < half:
        num_neg = min(negative.numel(), num_samples - num_pos)
    pos_idx = positive[torch.randperm(positive.numel(), device=labels.device)[:num_pos]]
    neg_idx = negative[torch.randperm(negative.numel(), device=labels.device)[:num_neg]]
    picked = torch.cat([pos_idx, neg_idx])
    picked = picked[torch.randperm(picked.numel(), device=labels.device)]
    valid = torch.ones(picked.shape, dtype=torch.bool, device=labels.device)
    return SampleResult(features[picked], labels[picked], valid)


def nonzero_sample_batched(features: Tensor, labels: Tensor, num_samples: int) -> SampleResult:
    """Sample a batch [B, N, D] / [B, N] the only way a dynamic-shape sampler can: one row at a time."""
    rows = [nonzero_sample(features[i], labels[i], num_samples) for i in range(labels.shape[0])]
    # Rows may pick fewer than K items; pad them to K slots so the batch stacks, as the static form returns.
    padded = [_pad(row, num_samples) for row in rows]
    return SampleResult(*(torch.stack(parts) for parts in zip(*padded, strict=True)))


def _pad(row: SampleResult, num_samples: int) -> SampleResult:
    missing = num_samples - row.labels.shape[0]
    if missing == 0:
        return row
    features = torch.cat([row.features, row.features.new_zeros(missing, row.features.shape[-1])])
    labels = torch.cat([row.labels, row.labels.new_full((missing,), INVALID_LABEL)])
    valid = torch.cat([row.valid, row.valid.new_zeros(missing)])
    return SampleResult(features, labels, valid)


def static_sample(features: Tensor, labels: Tensor, num_samples: int) -> SampleResult:
    """Fixed-shape sampling of one row [N, D] or a batch [B, N, D]; always K slots plus a ``valid`` mask."""
    half = num_samples // 2
    pos_mask = labels == POSITIVE
    neg_mask = labels == NEGATIVE
    num_pos_avail = torch.count_nonzero(pos_mask, dim=-1)
    num_neg_avail = torch.count_nonzero(neg_mask, dim=-1)
    num_pos = num_pos_avail.clamp(max=half)
    num_neg = num_neg_avail.clamp(max=half)
    # The same top-up rule as the naive form, as tensors: no value ever reaches the host.
    neg_short = num_neg < half
    pos_short = num_pos < half
    num_pos = torch.where(neg_short, torch.minimum(num_pos_avail, num_samples - num_neg), num_pos)
    num_neg = torch.where(~neg_short & pos_short, torch.minimum(num_neg_avail, num_samples - num_pos), num_neg)

    # A random key per item, -1 for items of the other class: the top keys are a uniform random subset.
    keys = torch.rand(labels.shape, device=labels.device)
    k = min(num_samples, labels.shape[-1])
    slots = torch.arange(k, device=labels.device)
    pos_key, pos_idx = torch.topk(torch.where(pos_mask, keys, -1.0), k)
    neg_key, neg_idx = torch.topk(torch.where(neg_mask, keys, -1.0), k)
    # The host cannot know how many of the k candidates to keep, so it keeps all k and invalidates the rest.
    pos_ok = slots < num_pos.unsqueeze(-1)
    neg_ok = slots < num_neg.unsqueeze(-1)
    candidates = torch.cat([pos_idx, neg_idx], dim=-1)
    ok = torch.cat([pos_ok, neg_ok], dim=-1)
    # A fresh key mixes the order: reusing the selection keys would put the larger class's picks first.
    mix = torch.where(ok, torch.rand(ok.shape, device=labels.device), -1.0)
    if mix.shape[-1] < num_samples:
        # Fewer than K/2 items in all: pad so K slots can still be drawn; padding is never valid.
        pad = num_samples - mix.shape[-1]
        mix = torch.cat([mix, mix.new_full((*mix.shape[:-1], pad), -1.0)], dim=-1)
        candidates = torch.cat([candidates, candidates.new_zeros((*candidates.shape[:-1], pad))], dim=-1)
    mix_key, order = torch.topk(mix, num_samples)
    picked = torch.gather(candidates, -1, order)
    valid = mix_key >= 0
    picked_features = torch.gather(features, -2, picked.unsqueeze(-1).expand(*picked.shape, features.shape[-1]))
    picked_labels = torch.gather(labels, -1, picked)
    return SampleResult(
        torch.where(valid.unsqueeze(-1), picked_features, 0.0),
        torch.where(valid, picked_labels, INVALID_LABEL),
        valid,
    )


def floor_sample(features: Tensor, labels: Tensor, num_samples: int) -> SampleResult:
    """The floor: K items of one row or a batch by one ``topk`` over random keys, whatever their labels."""
    k = min(num_samples, labels.shape[-1])
    _, picked = torch.topk(torch.rand(labels.shape, device=labels.device), k)
    picked_features = torch.gather(features, -2, picked.unsqueeze(-1).expand(*picked.shape, features.shape[-1]))
    return SampleResult(picked_features, torch.gather(labels, -1, picked), torch.ones_like(picked, dtype=torch.bool))


Sampler = Callable[[Tensor, Tensor, int], SampleResult]

# Per variant: how it takes one row, and how it takes a batch.
VARIANTS: dict[str, tuple[Sampler, Sampler]] = {
    "nonzero": (nonzero_sample, nonzero_sample_batched),
    "static": (static_sample, static_sample),
}
# What a case can run: the variants and the floor.
_CASES: dict[str, tuple[Sampler, Sampler]] = {**VARIANTS, FLOOR: (floor_sample, floor_sample)}


def check_inputs(features: Tensor, labels: Tensor, num_samples: int) -> None:
    """Raise a clear error for inputs no variant accepts (metadata only: checking values would sync)."""
    check_tensor("features", features)
    check_tensor("labels", labels)
    check_positive_int("num_samples", num_samples, even=True)
    # Signed only: the -1 that marks an empty slot must be representable.
    check_dtype("labels", labels, (torch.int64, torch.int32, torch.int16, torch.int8), "labels")
    check_dtype("features", features, (torch.float16, torch.bfloat16, torch.float32, torch.float64), "features")
    check_ndim("labels", labels, (1, 2), "[N] or a batch [B, N]")
    check_ndim("features", features, (labels.ndim + 1,), f"{'[B, N, D]' if labels.ndim == 2 else '[N, D]'}")
    if tuple(features.shape[:-1]) != tuple(labels.shape):
        raise ValueError(
            f"features has shape {tuple(features.shape)} and labels {tuple(labels.shape)}; "
            "features must be labels' shape plus a feature dim"
        )
    check_same_device(features=features, labels=labels)


def sample(variant: str, features: Tensor, labels: Tensor, num_samples: int) -> SampleResult:
    """Pick ``num_samples`` balanced positives and negatives with one variant.

    Args:
        variant: one of ``VARIANTS`` (nonzero, static).
        features: [N, D], or a batch [B, N, D].
        labels: [N] or [B, N], integer; 1 positive, 0 negative, anything else never picked.
        num_samples: K, a positive even int.

    Returns:
        ``SampleResult(features, labels, valid)``; ``static`` always has K slots, ``nonzero`` has ``pos + neg``
        for one row and K (padded) for a batch.
    """
    single, batched = VARIANTS[check_choice("variant", variant, VARIANTS)]
    check_inputs(features, labels, num_samples)
    return (batched if labels.ndim == 2 else single)(features, labels, num_samples)


def default_num_samples(n: int, ratio: int = 10) -> int:
    """K when none is given: N / ratio rounded down to an even number, at least 2 (half positives, half negatives)."""
    return max(2, n // ratio // 2 * 2)


@dataclass(frozen=True)
class SamplerConfig:
    """One sampling case: ``batch`` rows of N items with ``feature_dim`` features, K picks per row.

    ``num_samples`` (K) defaults to `default_num_samples` (N / ``ratio`` rounded down to an even number, at
    least 2); given, it must be a positive even int.
    """

    variant: str = "nonzero"
    n: int = 10_000
    batch: int = 1
    feature_dim: int = 16
    num_samples: int | None = None
    ratio: int = 10
    device: str = "cpu"
    compiled: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        check_choice("variant", self.variant, _CASES)
        check_positive_int("n", self.n)
        check_positive_int("batch", self.batch)
        check_positive_int("feature_dim", self.feature_dim)
        check_positive_int("ratio", self.ratio)
        if self.num_samples is None:
            object.__setattr__(self, "num_samples", default_num_samples(self.n, self.ratio))
        check_positive_int("num_samples", self.num_samples, even=True)


def estimate_sample_bytes(n: int, batch: int, feature_dim: int = 16) -> int:
    """Estimate the peak bytes of one sampling call: inputs plus the static form's keys, masks and top-k."""
    items = n * batch
    return items * (4 * feature_dim + 8 + 4 * 4 + 8 * 4)


def seeded_items(n: int, batch: int, feature_dim: int, device: torch.device, seed: int) -> tuple[Tensor, Tensor]:
    """Return the article's inputs: features ``randn``, labels ``randint(0, 2)``; one row or a batch."""
    generator = torch.Generator().manual_seed(seed)
    shape = (n,) if batch == 1 else (batch, n)
    features = torch.randn(*shape, feature_dim, generator=generator)
    labels = torch.randint(0, 2, shape, generator=generator)
    return features.to(device), labels.to(device)


class SampleCall:
    """One sampling call of a variant on inputs built once; call with no arguments."""

    def __init__(self, config: SamplerConfig) -> None:
        self.config = config
        self.device = resolve_device(config.device)
        self.features, self.labels = seeded_items(config.n, config.batch, config.feature_dim, self.device, config.seed)
        single, batched = _CASES[config.variant]
        self.fn: Sampler = batched if config.batch > 1 else single
        self.call: Sampler = torch.compile(self.fn) if config.compiled else self.fn

    def __call__(self) -> SampleResult:
        return self.call(self.features, self.labels, self.num_samples)

    @property
    def num_samples(self) -> int:
        return int(self.config.num_samples)  # type: ignore[arg-type]  # set in SamplerConfig.__post_init__


def make_sample_call(config: SamplerConfig) -> SampleCall:
    """Build a sampling call for one case.

    Args:
        config: variant, N, batch, feature dim, ratio N/K, device, compiled, seed.

    Returns:
        A zero-argument callable running one sampling call and returning its ``SampleResult``.
    """
    return SampleCall(config)


def sample_violations(result: SampleResult, features: Tensor, labels: Tensor) -> list[str]:
    """List how a sampling result breaks the rules (empty when it obeys them); inputs are one row or a batch.

    Each row's valid picks, as (feature vector, label) pairs, must be items of that row, none taken more often than
    the row holds it: compared as multisets, never by the position of the first equal feature vector. Random normal
    features do repeat (17 of 200,000 seeded rows of 104 one-dimensional items), and two equal vectors with
    different labels are two items, either of which may be picked.
    """
    problems = []
    rows = labels.reshape(-1, labels.shape[-1])
    row_features = features.reshape(-1, *features.shape[-2:])
    picked_rows = result.labels.reshape(rows.shape[0], -1)
    valid_rows = result.valid.reshape(rows.shape[0], -1)
    picked_feature_rows = result.features.reshape(rows.shape[0], -1, features.shape[-1])
    for i in range(rows.shape[0]):
        valid = valid_rows[i]
        picked_labels = picked_rows[i][valid]
        items = Counter(zip(map(tuple, row_features[i].tolist()), rows[i].tolist(), strict=True))
        picks = Counter(zip(map(tuple, picked_feature_rows[i][valid].tolist()), picked_labels.tolist(), strict=True))
        vectors = {vector for vector, _ in items}
        if any(vector not in vectors for vector, _ in picks):
            problems.append(f"row {i}: a picked feature vector is not in the input")
            continue
        if any(pick not in items for pick in picks):
            problems.append(f"row {i}: labels do not match the picked features")
        if any(count > items[pick] for pick, count in picks.items() if pick in items):
            problems.append(f"row {i}: an item was picked twice")
        if not bool(((picked_labels == 0) | (picked_labels == 1)).all()):
            problems.append(f"row {i}: an item of neither class was picked")
    return problems


def class_counts(result: SampleResult, batch_shape: tuple[int, ...]) -> Tensor:
    """Return per-row (positives, negatives) among the valid picks, shape [rows, 2]."""
    labels = result.labels.reshape(*batch_shape, -1)
    valid = result.valid.reshape(*batch_shape, -1)
    positives = ((labels == POSITIVE) & valid).sum(-1)
    negatives = ((labels == NEGATIVE) & valid).sum(-1)
    return torch.stack([positives, negatives], -1).reshape(-1, 2)


def sampler_inputs(seed: int = 0) -> Iterator[tuple[str, Tensor, Tensor, int]]:
    """Yield small seeded (name, features, labels, K) sets on the host, the short-class edge cases among them."""
    generator = torch.Generator().manual_seed(seed)
    n, d = 200, 4
    features = torch.randn(4, n, d, generator=generator)
    labels = torch.randint(-1, 2, (4, n), generator=generator)
    labels[1] = torch.where(labels[1] == 1, 0, labels[1])  # no positives
    labels[2, 10:] = -1  # fewer eligible items than K
    yield "batch of mixed rows", features, labels, 40
    yield "one row", features[0], labels[0], 40
    yield "N < K", features[3, :30], labels[3, :30], 40


def compare(family: Family, variant: str, device: torch.device) -> Comparison:
    """Compare one sampler variant with ``nonzero``: per-row class counts, and the rules on its own picks."""
    worst, failed = 0.0, []
    torch.manual_seed(0)
    for name, features, labels, k in sampler_inputs():
        features, labels = features.to(device), labels.to(device)
        batch_shape = tuple(labels.shape[:-1]) or (1,)
        want = class_counts(sample(family.baseline, features, labels, k), batch_shape)
        got_result = sample(variant, features, labels, k)
        got = class_counts(got_result, batch_shape)
        worst = max(worst, float((got - want).abs().max().item()))
        problems = sample_violations(got_result, features, labels)
        if problems or not torch.equal(got, want):
            failed.append(name + (f" ({problems[0]})" if problems else " (class counts differ)"))
    return Comparison(family.name, variant, str(device), not failed, worst, ", ".join(failed))


def build(variant: str, device: torch.device, compiled: bool, params: dict[str, Any]) -> Case:
    """One sampling call of a variant (or the floor) as a case; ``fn`` is the sampler itself."""
    call = make_sample_call(SamplerConfig(variant=variant, device=str(device), compiled=compiled, **params))
    params = {**params, "num_samples": call.num_samples}
    return Case(FAMILY.name, variant, device, compiled, params, call, call.fn,
                (call.features, call.labels, call.num_samples))


# The article's sweep: N from 1e3 to 1e7, one row per call and a batch of 32 rows per call.
ARTICLE_N = (1_000, 10_000, 100_000, 1_000_000, 10_000_000)
ARTICLE_BATCH = 32

FAMILY = Family(
    name="sampler",
    article="004",
    summary="balanced sampler: nonzero (dynamic shapes) vs count_nonzero/topk/gather (static shapes)",
    variants=tuple(VARIANTS),
    params=(
        Param("n", 10_000, "items per row (N)"),
        Param("batch", 1, "rows per call; nonzero loops over them in Python"),
        Param("feature_dim", 16, "features per item"),
        Param("num_samples", None, "picks per row (K), even; default N/10 rounded down to an even number, at least 2",
              kind=int),
    ),
    builder=build,
    estimate=lambda params: estimate_sample_bytes(params["n"], params["batch"], params["feature_dim"]),
    comparer=compare,
    smoke={"n": 1_000, "batch": 1},
    grids={
        "quick": {"n": (1_000, 10_000, 100_000), "batch": (1, 32)},
        "full": {"n": ARTICLE_N, "batch": (1, ARTICLE_BATCH)},
    },
    article_sizes=tuple({"n": n, "batch": batch} for batch in (1, ARTICLE_BATCH) for n in ARTICLE_N),
    compile_sweep="n",
    unit="call",
)

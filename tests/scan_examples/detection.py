"""The pattern of torchvision's detection Matcher and BalancedPositiveNegativeSampler, rewritten for a scan test.

Four images per call. The matcher labels each prediction with its best ground truth, or -1 / -2 by mask
assignment of a Python scalar (ATen's masked_fill_ path: no sync on CUDA); the sampler draws positives and
negatives of each image with one-argument torch.where (nonzero: one sync each, two per image), and marks them in
its masks by writing the Python number 1 through integer indices (`_index_put_impl_` copies it to the device,
blocking: one sync each, two more per image).
"""

from __future__ import annotations

import torch

BELOW_LOW_THRESHOLD = -1
BETWEEN_THRESHOLDS = -2
IMAGES = 4


class Matcher:
    """Match each prediction to the ground truth of highest quality, or mark it below or between thresholds."""

    def __init__(self, high: float, low: float) -> None:
        self.high, self.low = high, low

    def __call__(self, quality: torch.Tensor) -> torch.Tensor:
        matched_vals, matches = quality.max(dim=0)
        below_low_threshold = matched_vals < self.low
        between_thresholds = (matched_vals >= self.low) & (matched_vals < self.high)
        matches[below_low_threshold] = BELOW_LOW_THRESHOLD
        matches[between_thresholds] = BETWEEN_THRESHOLDS
        return matches


class Sampler:
    """Sample a fixed share of positive and negative predictions per image, as index masks."""

    def __init__(self, per_image: int, positive_fraction: float) -> None:
        self.per_image, self.positive_fraction = per_image, positive_fraction

    def __call__(self, labels: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        positives, negatives = [], []
        for labels_per_image in labels:
            positive = torch.where(labels_per_image >= 1)[0]
            negative = torch.where(labels_per_image == 0)[0]
            num_pos = min(positive.numel(), int(self.per_image * self.positive_fraction))
            num_neg = min(negative.numel(), self.per_image - num_pos)
            perm1 = torch.randperm(positive.numel(), device=positive.device)[:num_pos]
            perm2 = torch.randperm(negative.numel(), device=negative.device)[:num_neg]
            pos_mask = torch.zeros_like(labels_per_image, dtype=torch.uint8)
            neg_mask = torch.zeros_like(labels_per_image, dtype=torch.uint8)
            pos_mask[positive[perm1]] = 1
            neg_mask[negative[perm2]] = 1
            positives.append(pos_mask)
            negatives.append(neg_mask)
        return positives, negatives


def make_step():
    """A step over four images: match, label (background 0, ignored -1), sample."""
    g = torch.Generator().manual_seed(0)
    quality = [torch.rand(5, 200, generator=g) for _ in range(IMAGES)]
    matcher, sampler = Matcher(high=0.7, low=0.3), Sampler(per_image=64, positive_fraction=0.25)

    def step():
        labels = []
        for q in quality:
            matches = matcher(q)
            labels_per_image = (matches >= 0).to(torch.int64)
            labels_per_image[matches == BELOW_LOW_THRESHOLD] = 0
            labels_per_image[matches == BETWEEN_THRESHOLDS] = -1
            labels.append(labels_per_image)
        return sampler(labels)

    return step

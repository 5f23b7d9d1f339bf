"""A user's input pipeline with planted costs, for `pitfalls scan-loader`'s tests (and the README's example).

8-bit images returned as normalized float32 and masks as int64 (the article's naive form), a metadata list of
dicts (PyTorch issue 13246's shape), a per-item cost and a step cost, both sleeps so that two busy cores do not
decide them. The costs are read from the environment so that a test (or a reader) can move the crossover.
"""

from __future__ import annotations

import os
import time

import torch
from torch.utils.data import DataLoader, Dataset

ITEMS = 48
SIZE = 32
CLASSES = 21
BATCH = 4
WORKERS = 1
PREFETCH = 2
MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1) * 255
STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1) * 255


def item_s() -> float:
    return float(os.environ.get("PIPELINE_ITEM_MS", "25")) / 1000


def step_s() -> float:
    return float(os.environ.get("PIPELINE_STEP_MS", "10")) / 1000


class Segmentation(Dataset):
    """Items of (image float32 [3, S, S] normalized on the host, mask int64 [S, S]), with a planted cost."""

    def __init__(self, items: int = ITEMS, size: int = SIZE) -> None:
        generator = torch.Generator().manual_seed(0)
        self.images = torch.randint(0, 256, (items, 3, size, size), dtype=torch.uint8, generator=generator)
        self.masks = torch.randint(0, CLASSES, (items, size, size), dtype=torch.uint8, generator=generator)
        self.records = [{"path": f"images/{i:06d}.png", "height": size, "width": size, "classes": [i % CLASSES]}
                        for i in range(items)]
        self.cost_s = item_s()

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(self.cost_s)
        record = self.records[index]
        assert record["height"] == self.images.shape[2]
        return (self.images[index].float() - MEAN) / STD, self.masks[index].long()


def loader() -> DataLoader:
    """The user's loader: 1 worker, prefetch_factor 2."""
    return DataLoader(Segmentation(), batch_size=BATCH, num_workers=WORKERS, prefetch_factor=PREFETCH,
                      drop_last=True)


def step(batch: tuple[torch.Tensor, torch.Tensor]) -> None:
    """The user's training step: a planted cost."""
    images, masks = batch
    assert images.dtype == torch.float32 and masks.dtype == torch.int64
    time.sleep(step_s())

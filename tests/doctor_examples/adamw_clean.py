"""A plain training loop with AdamW and no planted hazard: the doctor must find no sync in it.

Run as ``python adamw_clean.py --lr 1e-3 [--foreach]``; it trains until it is stopped.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset


class Endless(Dataset):
    """A million items, each made from its index."""

    def __len__(self) -> int:
        return 10**6

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(index)
        return torch.randn(16, generator=g), torch.randint(0, 4, (), generator=g)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--foreach", action="store_true")
    args = parser.parse_args()
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, foreach=args.foreach)
    for x, y in DataLoader(Endless(), batch_size=16):
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()

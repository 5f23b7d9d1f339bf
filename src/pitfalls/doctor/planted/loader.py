"""A loader-bound training script, the known answer of `pitfalls doctor --try` (``python loader.py``; it imports
nothing of pitfalls and trains until it is stopped).

Each item sleeps ``--item-ms`` in a DataLoader of ``--batch`` items a batch with no workers, shuffled; each step
sleeps ``--step-ms`` besides a small model's step. With ``--augment`` each item adds noise drawn from torch's random
generator: in the main process from the script's seed, in a worker from that worker's own seed, so the batches with
workers are not the batches without.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

FEATURES = 4


class Sleepy(Dataset):
    """Items made from their index, each after a planted sleep; noisy with ``augment``."""

    def __init__(self, items: int, item_ms: float, augment: bool) -> None:
        self.items = items
        self.item_s = item_ms / 1e3
        self.augment = augment

    def __len__(self) -> int:
        return self.items

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(self.item_s)
        x = torch.full((FEATURES,), float(index % 7))
        if self.augment:
            x = x + torch.rand(FEATURES)  # the random augmentation: each worker's own generator
        return x, torch.tensor(index % 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--item-ms", type=float, default=10.0)
    parser.add_argument("--step-ms", type=float, default=10.0)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--augment", action="store_true")
    args = parser.parse_args()
    # The step's cost is its planted sleep: on one thread the tiny model's ops never wait for a second one, which a
    # busy shared machine schedules late.
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Linear(FEATURES, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Sleepy(10**6, args.item_ms, args.augment), batch_size=args.batch, shuffle=True)
    while True:
        for x, y in loader:
            time.sleep(args.step_ms / 1e3)  # the step's planted work
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()


if __name__ == "__main__":
    main()

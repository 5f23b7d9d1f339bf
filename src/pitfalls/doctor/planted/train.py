"""A training script with planted costs, the known answers `pitfalls doctor` must read (it imports nothing of
pitfalls and runs as any user's script would: ``python train.py --items 1000000``).

Planted, in every training step:

- ``.item()`` on one line (the running loss) and ``nonzero`` on another (the rows predicted positive);
- a helper with a sync (``int()`` of a device tensor), called from one line of the loop;
- ``.tolist()`` every fifth step;
- a dataset that sleeps ``--item-ms`` per item, loaded with ``num_workers=0``: the loop waits ``--batch`` x
  ``--item-ms`` ms per step in ``next()``;
- a compiled function with one graph break (``torch._dynamo.graph_break()``), called with a second shape (half
  the batch), so it compiles again.

AdamW steps the model, so its host-side step counts must read as no sync. It trains forever: ``while True`` over
epochs of ``--items`` items (``10**6`` is the endless dataset the doctor must stop).
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

FEATURES = 16


class SleepyDataset(Dataset):
    """Items made on the fly, each after a planted sleep."""

    def __init__(self, items: int, item_ms: float) -> None:
        self.items = items
        self.item_s = item_ms / 1e3

    def __len__(self) -> int:
        return self.items

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(self.item_s)
        x = torch.randn(FEATURES, generator=torch.Generator().manual_seed(index))
        return x, (x.sum() > 0).long()


def count_positive(scores: torch.Tensor) -> int:
    return int((scores > 0).sum())  # the helper's sync


def scale(x: torch.Tensor) -> torch.Tensor:
    y = x * 2.0
    torch._dynamo.graph_break()
    return y + 1.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, required=True, help="items per epoch")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--item-ms", type=float, default=10.0)
    parser.add_argument("--backend", default="inductor", help="torch.compile's backend")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = DataLoader(SleepyDataset(args.items, args.item_ms), batch_size=args.batch, shuffle=True)
    scaled = torch.compile(scale, backend=args.backend)
    step, running, hits, positives, logged = 0, 0.0, 0, 0, []
    while True:
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            features = scaled(x) + scaled(x[: len(x) // 2]).mean()
            logits = model(features)
            loss = F.cross_entropy(logits, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            running += loss.item()
            hits += len(torch.nonzero(logits.argmax(1)))
            positives += count_positive(logits[:, 1])
            if step % 5 == 0:
                logged.append(logits.detach()[0].tolist())
            step += 1


if __name__ == "__main__":
    main()

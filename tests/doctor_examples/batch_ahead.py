"""Batches fetched ahead, before the step that uses them began: a DataLoader's, and one stacked from NumPy
windows; each is read on the host by ``torch.nonzero`` and never goes to a device.

Label, from torch/utils/data/dataloader.py (a batch is collated in the main process or a worker, on the host;
``pin_memory`` pins it, still on the host) and torch/_torch_docs.py (``from_numpy`` shares the array's memory):
both batches are host data, and ``nonzero`` of host data needs no copy from a device. So no sync at either
``nonzero`` line, in any scanned step, the first included.

Run as ``python batch_ahead.py``; it trains until it is stopped.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

WINDOWS = np.random.default_rng(0).standard_normal((64, 8)).astype(np.float32)


def windows(step: int) -> torch.Tensor:
    return torch.stack([torch.from_numpy(WINDOWS[(step + k) % 64]) for k in range(4)])


def main() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    data = TensorDataset(torch.randn(10**5, 8))
    batches = iter(DataLoader(data, batch_size=4))
    (x,) = next(batches)
    w = windows(0)
    step = 0
    while True:
        loss = model(x).square().mean() + model(w).square().mean()
        loss.backward()
        positives = torch.nonzero(x[:, 0] > 0)  # the loader's batch, on the host: no sync
        ahead = torch.nonzero(w[:, 0] > 0)  # the NumPy windows, on the host: no sync
        step += 1 + 0 * (len(positives) + len(ahead))
        (x,) = next(batches)  # the next batches, fetched before this step's end
        w = windows(step)
        optimizer.step()
        optimizer.zero_grad()


if __name__ == "__main__":
    main()

"""Batches from a DataLoader asked for pinned memory, copied to the device with ``non_blocking=True``.

Label, from torch/utils/data/dataloader.py (``pin_memory``: "If ``True``, the data loader will copy Tensors into
device/CUDA pinned memory before returning them"): on a GPU the batch is page-locked, so its non-blocking copy
overlaps the step. A run without an accelerator pins nothing (the loader warns), so the doctor must read the
loader's setting, not the memory: no copy from pageable memory at the ``.to`` line, and no sync.

Run as ``python pinned_batches.py``; it trains until it is stopped.
"""

from __future__ import annotations

import warnings

import torch
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = torch.nn.Linear(8, 1).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    data = TensorDataset(torch.randn(10**5, 8))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "pin_memory ... no accelerator is found" on a CPU
        for (x,) in DataLoader(data, batch_size=16, pin_memory=True):
            x = x.to(device, non_blocking=True)  # pinned on a GPU: overlaps the step
            loss = model(x).square().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


if __name__ == "__main__":
    main()

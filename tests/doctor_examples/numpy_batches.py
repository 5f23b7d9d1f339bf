"""nanoGPT's ``get_batch``: windows of a NumPy token array, each made a tensor by ``torch.from_numpy``, stacked,
and moved to the script's device, here the CPU.

Label, from torch/_torch_docs.py (``from_numpy``): "The returned tensor and :attr:`ndarray` share the same
memory": the windows are host data, and so is their ``torch.stack`` (an op of host tensors alone). Moving host data
to "cpu" copies nothing; on a GPU the same line is a copy to the device, never one to the host. So no
device-to-host copy and no sync at ``get_batch``'s lines.

Run as ``python numpy_batches.py``; it trains until it is stopped.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

BLOCK, BATCH, VOCAB = 8, 4, 32
TOKENS = np.arange(4096, dtype=np.uint16) % VOCAB
DEVICE = "cpu"


def get_batch() -> tuple[torch.Tensor, torch.Tensor]:
    ix = torch.randint(len(TOKENS) - BLOCK, (BATCH,))
    x = torch.stack([torch.from_numpy(TOKENS[i:i + BLOCK].astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy(TOKENS[i + 1:i + 1 + BLOCK].astype(np.int64)) for i in ix])
    x, y = x.to(DEVICE), y.to(DEVICE)
    return x, y


def main() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(VOCAB, 16), torch.nn.Linear(16, VOCAB))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = get_batch()
    while True:
        loss = F.cross_entropy(model(x).view(-1, VOCAB), y.view(-1))
        x, y = get_batch()  # the next batch, fetched before this step's end, as nanoGPT prefetches it
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


if __name__ == "__main__":
    main()

"""A loop with no optimizer over a DataLoader with forked workers, restarted every two batches; each item reports the
torch modes on in the worker that made it, and the script writes the most it saw to MARKER when it is stopped. Each
batch is copied to the device and read back with ``.item()``: two syncs a step on a GPU.

Run as ``python loader_only.py MARKER``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.overrides import _get_current_function_mode_stack
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
from torch.utils.data import DataLoader, Dataset


class ModesSeen(Dataset):
    """Eight items: a value, and how many torch modes were on where the item was made."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        modes = len(_get_current_function_mode_stack()) + len(_get_current_dispatch_mode_stack())
        return torch.full((4,), float(index)), modes


def main() -> None:
    marker = Path(sys.argv[1])
    device = torch.device("cpu")
    seen, total = 0, 0.0
    try:
        while True:
            # Not persistent: every epoch forks its workers again, in whatever phase the doctor is in.
            for values, modes in DataLoader(ModesSeen(), batch_size=4, num_workers=2,
                                            multiprocessing_context="fork"):
                seen = max(seen, int(modes.max()))
                total += values.to(device).sum().item()
    finally:
        marker.write_text(f"modes {seen}")


if __name__ == "__main__":
    main()

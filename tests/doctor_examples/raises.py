"""A training loop that raises in its fifth step, after closing what it opened (``finally`` writes MARKER).

Run as ``python raises.py MARKER``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch


def main() -> None:
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 4)
    step = 0
    try:
        while True:
            step += 1
            if step == 5:
                raise ValueError("planted failure in step 5")
            optimizer.zero_grad()
            model(x).square().mean().backward()
            optimizer.step()
    finally:
        Path(sys.argv[1]).write_text(f"finally ran in step {step}")


if __name__ == "__main__":
    main()

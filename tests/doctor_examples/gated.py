"""A small training loop with one sync a step, the script a CI gate guards (``pitfalls doctor --baseline``).

Run as ``python gated.py``; it trains until it is stopped.
"""

from __future__ import annotations

import torch


def main() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    x, running = torch.randn(16, 8), 0.0
    while True:
        loss = model(x).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        running += loss.item()  # the step's one sync


if __name__ == "__main__":
    main()

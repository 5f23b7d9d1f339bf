"""A training step that logs its loss with .item() and keeps metrics with .cpu(), and a shared helper."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def make_step():
    """A step of a small classifier: SGD, the loss logged, the predictions copied out for metrics."""
    g = torch.Generator().manual_seed(0)
    model = torch.nn.Linear(16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(32, 16, generator=g), torch.randint(0, 4, (32,), generator=g)
    history: list[float] = []
    metrics: list[torch.Tensor] = []

    def step():
        opt.zero_grad()
        preds = model(x)
        loss = F.cross_entropy(preds, y)
        loss.backward()
        opt.step()
        history.append(loss.item())
        metrics.append(preds.detach().argmax(1).cpu())

    return step


def positions(mask: torch.Tensor) -> torch.Tensor:
    return mask.nonzero().squeeze(1)


def make_helper_step():
    """A step that calls one helper with a sync from two lines."""
    x = torch.randn(64, generator=torch.Generator().manual_seed(0))

    def step():
        above = positions(x > 0.5)
        below = positions(x < -0.5)
        return above, below

    return step

"""Training steps with AdamW and a GradScaler: the optimizer's host-side step count is no sync, the scaler's check is.

`make_step` is a factory; `step` is a step of its own, whose first call (when the scan loads it) is its warm-up.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

_g = torch.Generator().manual_seed(0)
_model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
_opt = torch.optim.AdamW(_model.parameters(), lr=1e-3)
_x, _y = torch.randn(32, 16, generator=_g), torch.randint(0, 4, (32,), generator=_g)


def step() -> float:
    """AdamW over 4 parameter tensors, single-tensor (the CPU default), and the loss read with .item()."""
    _opt.zero_grad()
    loss = F.cross_entropy(_model(_x), _y)
    loss.backward()
    _opt.step()
    return loss.item()


def make_step():
    """AdamW, foreach, behind a GradScaler and clip_grad_norm_: the scaler's inf check is the step's one sync."""
    model = torch.nn.Linear(16, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    scaler = torch.amp.GradScaler("cpu")
    x, y = torch.randn(32, 16, generator=_g), torch.randint(0, 4, (32,), generator=_g)

    def scaled_step() -> None:
        opt.zero_grad()
        scaler.scale(F.cross_entropy(model(x), y)).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()

    return scaled_step

"""A training script with one of each rule of `pitfalls doctor` planted, and beside each its right-thing counterpart
(``python rules.py --device cpu``; it imports nothing of pitfalls and trains until it is stopped).

Planted, each on a line that says so (and the counterpart that must read no finding):

- an AdamW with ``foreach=False``, which runs tensor by tensor on a GPU (an AdamW with foreach unset);
- ``zero_grad(set_to_none=False)`` (``zero_grad()``);
- a convolution with a bias straight into a BatchNorm (one with ``bias=False``);
- a float32 matmul while the float32 matmul precision is "highest" (a no-grad one under "high");
- a float32 convolution while cuDNN's TF32 is off (the model's convolutions, with it on, the default);
- a bf16 matmul with a size of 12 (one whose sizes are all multiples of 8);
- a tensor ``torch.randn`` fills on the host each step, then copies to the device (one made there);
- a batch copied to the device blocking, whose fix is pinned memory and ``non_blocking=True``, not a device factory;
- a batch copied without blocking from pageable memory (a batch from a DataLoader with ``pin_memory=True``, pinned
  on a GPU though a machine without an accelerator pins nothing).
"""

from __future__ import annotations

import argparse
import warnings

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

BATCH, CHANNELS, CLASSES, PIXELS = 8, 8, 10, 8


class Model(nn.Module):
    """Two convolutions, each into a BatchNorm, and three heads."""

    def __init__(self) -> None:
        super().__init__()
        self.biased = nn.Conv2d(3, CHANNELS, 3, padding=1)  # planted: a bias straight into a BatchNorm
        self.norm1 = nn.BatchNorm2d(CHANNELS)
        self.plain = nn.Conv2d(CHANNELS, CHANNELS, 3, padding=1, bias=False)  # right: no bias before the BatchNorm
        self.norm2 = nn.BatchNorm2d(CHANNELS)
        self.head = nn.Linear(CHANNELS, CLASSES)
        self.odd = nn.Linear(CHANNELS, 12)
        self.even = nn.Linear(CHANNELS, 16)

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.norm2(self.plain(F.relu(self.norm1(self.biased(images))))).mean((2, 3))
        logits = self.head(x)  # planted: a float32 matmul at the "highest" precision
        with torch.autocast(images.device.type, dtype=torch.bfloat16):
            odd = self.odd(x)  # planted: a bf16 matmul with a size of 12
            even = self.even(x)  # right: every size a multiple of 8
        return logits, odd.float().sum(1) + even.float().sum(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    model = Model().to(device)
    teacher = nn.Linear(3, CLASSES).to(device)
    blur = nn.Conv2d(3, 3, 3, padding=1, bias=False).to(device)
    first = [p for n, p in model.named_parameters() if n.startswith(("biased", "head"))]
    rest = [p for n, p in model.named_parameters() if not n.startswith(("biased", "head"))]
    slow = torch.optim.AdamW(first, lr=1e-3, foreach=False)  # planted: tensor by tensor
    fast = torch.optim.AdamW(rest, lr=1e-3)  # right: foreach unset, a GPU picks foreach
    data = TensorDataset(torch.randn(10**5, 3, PIXELS, PIXELS), torch.randint(0, CLASSES, (10**5,)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "pin_memory ... no accelerator is found" where there is none
        weights = iter(DataLoader(TensorDataset(torch.rand(10**5, CLASSES)), batch_size=BATCH, pin_memory=True))
    for images, labels in DataLoader(data, batch_size=BATCH):
        images = images.to(device, non_blocking=True)  # planted: a non-blocking copy from pageable memory
        (weight,) = next(weights)
        weight = weight.to(device, non_blocking=True)  # right: a non-blocking copy from pinned memory
        labels = labels.to(device)  # planted: a batch's blocking copy (pinned memory, non_blocking)
        noise = torch.randn(BATCH, CLASSES).to(device)  # planted: a host fill copied to the device
        jitter = torch.randn(BATCH, CLASSES, device=device)  # right: made on the device
        with torch.no_grad():
            torch.backends.cudnn.allow_tf32 = False
            smoothed = blur(images)  # planted: a float32 convolution without TF32
            torch.backends.cudnn.allow_tf32 = True
            torch.set_float32_matmul_precision("high")
            target = teacher(smoothed.mean((2, 3)))  # right: a float32 matmul with TF32 allowed
            torch.set_float32_matmul_precision("highest")
        logits, extra = model(images)
        loss = F.cross_entropy(logits + noise + jitter, labels, weight=weight[0]) + (logits - target).square().mean() \
            + extra.mean()
        slow.zero_grad(set_to_none=False)  # planted: the gradients filled with zeros
        fast.zero_grad()  # right: set to None
        loss.backward()
        slow.step()
        fast.step()


if __name__ == "__main__":
    main()

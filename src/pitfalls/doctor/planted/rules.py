"""A training script with each rule of `pitfalls doctor` planted once, and beside each its right-thing twin
(``python rules.py --device cpu``; it imports nothing of pitfalls and trains until it is stopped).

A line that plants a rule says ``# planted: ...``; its twin, which must read no finding of that rule, says
``# right: ...`` (each rule's `Plant` names the two lines by their code). The rules are the doctor's (docs/doctor.md,
"The rules"): the model's, each class of sync hazard, the copies, the loader and its batch's dtypes, and
torch.compile's graph breaks and recompiles. The script counts its own steps: a compiled function meets a new shape
in step ``--new-shape-at`` (one of the doctor's timed steps).
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


def broken(x: torch.Tensor) -> torch.Tensor:
    y = x * 2.0
    torch._dynamo.graph_break()  # planted: a graph break
    return y + 1.0


def traced(x: torch.Tensor) -> torch.Tensor:
    return x * 2.0 + 1.0  # right: no break


def reshaped(x: torch.Tensor) -> torch.Tensor:  # planted: meets a new shape in a timed step
    return x.sum(0)


def same_shape(x: torch.Tensor) -> torch.Tensor:  # right: always the same shape
    return x.sum(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--new-shape-at", type=int, default=3, help="the step whose compiled call meets a new shape")
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
    compiled = [torch.compile(f, backend="eager") for f in (broken, traced, reshaped, same_shape)]
    data = TensorDataset(torch.randn(10**5, 3, PIXELS, PIXELS), torch.randint(0, CLASSES, (10**5,)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "pin_memory ... no accelerator is found" where there is none
        weights = iter(DataLoader(TensorDataset(torch.rand(10**5, CLASSES)), batch_size=BATCH, pin_memory=True))
    buffer = torch.zeros(BATCH, device=device)
    seen, kept, step = 0.0, torch.zeros((), device=device), 0
    torch.backends.cudnn.benchmark = True  # right: cuDNN times each convolution's fixed shapes once
    try:
        for images, labels in DataLoader(data, batch_size=BATCH):  # planted: wide dtypes; planted: the loader keeps up
            step += 1
            host_labels = labels
            images = images.to(device, non_blocking=True)  # planted: a non-blocking copy from pageable memory
            (weight,) = next(weights)  # right: a batch in its smallest lossless dtypes
            weight = weight.to(device, non_blocking=True)  # planted: a pinned copy's bytes; right: pageable
            labels = labels.to(device)  # planted: a batch's blocking copy
            ahead = torch.randn(BATCH, CLASSES).to(device, non_blocking=True)  # planted: a host fill, not blocking
            noise = torch.randn(BATCH, CLASSES).to(device)  # planted: a host fill copied to the device
            jitter = torch.randn(BATCH, CLASSES, device=device)  # right: made on the device, no copy at all
            with torch.no_grad():
                torch.backends.cudnn.allow_tf32 = False
                smoothed = blur(images)  # planted: a float32 convolution without TF32
                torch.backends.cudnn.allow_tf32 = True
                torch.set_float32_matmul_precision("high")
                target = teacher(smoothed.mean((2, 3)))  # right: a float32 matmul and convolution with TF32
                torch.set_float32_matmul_precision("highest")
            logits, extra = model(images)
            loss = F.cross_entropy(logits + noise + jitter + ahead, labels, weight=weight[0]) \
                + (logits - target).square().mean() + extra.mean()
            slow.zero_grad(set_to_none=False)  # planted: the gradients filled with zeros
            fast.zero_grad()  # right: set to None
            loss.backward()
            slow.step()
            fast.step()
            with torch.no_grad():
                scores = logits.detach()[:, 0]
                compiled[0](scores)
                compiled[1](scores)
                compiled[2](scores[: 4 if step < args.new_shape_at else 3])
                compiled[3](scores[:4])
                seen += scores.sum().item()  # planted: a scalar read
                kept += scores.sum()  # right: summed on the device
                picked = torch.nonzero(scores > 0)  # planted: nonzero
                counted = torch.count_nonzero(scores > 0)  # right: counted on the device
                positive = scores[scores > 0]  # planted: a boolean mask
                masked = torch.where(scores > 0, scores, 0.0)  # right: torch.where
                classes = torch.unique(labels)  # planted: unique
                ordered = torch.sort(labels).values  # right: sorted, and the changes counted on the device
                changes = (ordered[1:] != ordered[:-1]).sum()
                logged = scores[:2].tolist()  # planted: a blocking copy to the host
                copied = scores[:2].clone()  # right: kept on the device
                binned = torch.bincount(labels)  # planted: a data-dependent shape
                summed = torch.zeros(CLASSES, device=device).index_add_(0, labels, scores)  # right: a fixed shape
                counts = torch.full((BATCH,), 2, device=device)
                repeated = torch.repeat_interleave(scores, counts)  # planted: the repeats read on the host
                sized = torch.repeat_interleave(scores, counts, output_size=2 * BATCH)  # right: output_size given
                buffer[:2] = host_labels[:2]  # planted: a write of host data
                buffer[2:4] = labels[2:4]  # right: a write of device data
                order = torch.argsort(scores)[:2]
                buffer[order] = 1.0  # planted: an assignment of a host value
                buffer[order] = torch.full((), 2.0, device=device)  # right: a value made on the device
                as_array = None
                if device.type == "cpu":  # on CUDA the plant is a TypeError, not a sync
                    as_array = scores.numpy()  # planted: numpy of device data
                host_array = host_labels.numpy()  # right: numpy of host data
            del picked, counted, positive, masked, classes, changes, logged, copied, binned, summed, repeated, sized
            del as_array, host_array
    finally:
        torch.backends.cudnn.benchmark = False

if __name__ == "__main__":
    main()

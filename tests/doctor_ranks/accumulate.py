"""A DDP script for torchrun (gloo, on the CPU) that accumulates gradients over 4 micro-batches a step without
no_sync(): every micro-batch's backward all-reduces the one bucket of the model's gradients."""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

MICRO_BATCHES = 4
dist.init_process_group("gloo")
model = DDP(torch.nn.Linear(32, 8))  # one bucket: (32 * 8 + 8) float32 = 1056 bytes
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
while True:
    optimizer.zero_grad()
    for _ in range(MICRO_BATCHES):
        model(torch.randn(4, 32)).sum().backward()
    optimizer.step()

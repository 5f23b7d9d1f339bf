"""A DDP script for torchrun whose rank 1 raises in its fifth step; rank 0 goes on until its all-reduce finds rank 1
gone."""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
model = DDP(torch.nn.Linear(8, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
step = 0
while True:
    step += 1
    if rank == 1 and step == 5:
        raise ValueError("planted failure on rank 1 in step 5")
    loss = model(torch.randn(4, 8)).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

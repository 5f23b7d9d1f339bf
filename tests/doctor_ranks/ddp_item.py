"""A DDP training script for torchrun (gloo, on the CPU): a loss logged with .item() on rank 0 only, as scripts log
on their main process, and a DistributedSampler'd DataLoader; it trains until it is stopped."""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
data = TensorDataset(torch.randn(4096, 64), torch.randint(0, 10, (4096,)))
loader = DataLoader(data, batch_size=16, sampler=DistributedSampler(data))
try:
    while True:
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if rank == 0:
                print(f"loss {loss.item():.3f}")  # rank 0 logs: a sync on rank 0 only
finally:
    dist.destroy_process_group()

"""A DDP training script for torchrun, one GPU per process (the shape of PyTorch's DDP tutorial series): the device
set from LOCAL_RANK, an NCCL process group, the model moved to its GPU by index and wrapped with device_ids, a
DistributedSampler over a loader asked for pinned memory, and each batch copied to the GPU, blocking."""

import os
import sys

import torch
import torch.nn.functional as F
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class Pairs(Dataset):
    def __init__(self, size):
        generator = torch.Generator().manual_seed(0)
        self.rows = [(torch.rand(20, generator=generator), torch.rand(1, generator=generator)) for _ in range(size)]

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, index):
        return self.rows[index]


def train(epochs):
    gpu = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(gpu)
    init_process_group(backend="nccl")
    model = DistributedDataParallel(torch.nn.Linear(20, 1).to(gpu), device_ids=[gpu])
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    data = Pairs(2048)
    loader = DataLoader(data, batch_size=32, pin_memory=True, shuffle=False, sampler=DistributedSampler(data))
    for epoch in range(epochs):
        loader.sampler.set_epoch(epoch)
        for source, targets in loader:
            source = source.to(gpu)
            targets = targets.to(gpu)
            optimizer.zero_grad()
            loss = F.mse_loss(model(source), targets)
            loss.backward()
            optimizer.step()
    destroy_process_group()


if __name__ == "__main__":
    train(int(sys.argv[1]))

"""A DDP training script for torchrun with planted answers (``torchrun --nproc-per-node 2 ddp.py``, gloo, on the CPU;
it imports nothing of pitfalls and trains until it is stopped).

Planted, in every step of every rank: gradients accumulated over `MICRO_BATCHES` micro-batches without
``no_sync()``, so that each micro-batch's backward all-reduces the model's one bucket of gradients (`MICRO_BATCHES`
all-reduces of `BUCKET_BYTES` a step); and the loss logged with ``.item()`` on rank 0 only, as scripts log on their
main process (1 sync a step on rank 0, none on the others).
"""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

MICRO_BATCHES = 4
FEATURES, CLASSES = 32, 8
# One bucket: the Linear's weight and bias, float32.
BUCKET_BYTES = (FEATURES * CLASSES + CLASSES) * 4


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(FEATURES, CLASSES))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    try:
        while True:
            optimizer.zero_grad()
            for _ in range(MICRO_BATCHES):
                loss = model(torch.randn(4, FEATURES)).square().mean()
                loss.backward()
            optimizer.step()
            if rank == 0:
                print(f"loss {loss.item():.4f}")  # planted: a sync on rank 0 only
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""A CUDA script that asks torch.cuda and torch.accelerator what a GPU run asks, and checks each answer itself: the
device and its properties, memory, streams and events, a checkpoint loaded onto the GPU, DataParallel, the default
device, torch.cuda.amp, NVTX ranges and a collate function that moves its batch to the GPU. It raises at the first
answer that is not a GPU's."""

import sys
import tempfile
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def to_gpu(rows):
    return torch.stack([row[0] for row in rows]).to("cuda:0", non_blocking=True)


def check(condition, what):
    if not condition:
        raise AssertionError(f"not a GPU's answer: {what}")


def main(workers):
    check(torch.cuda.is_available() and torch.cuda.device_count() == 1, "one CUDA device")
    check(torch.accelerator.is_available() and torch.accelerator.current_accelerator().type == "cuda", "accelerator")
    torch.cuda.set_device(0)
    torch.accelerator.set_device_index(0)
    check(torch.cuda.current_device() == 0 == torch.accelerator.current_device_index(), "current device")
    check(torch.cuda.get_device_capability() >= (8, 0) and torch.cuda.is_bf16_supported(), "capability")
    check(torch.cuda.get_device_properties(0).total_memory > 0 and torch.cuda.get_device_name(0), "properties")
    torch.cuda.manual_seed_all(0)
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.empty_cache()
    with torch.cuda.device(0):
        check(torch.cuda.memory_allocated() == 0 and torch.cuda.max_memory_allocated() == 0, "memory")
    free, total = torch.cuda.mem_get_info()
    check(0 < free <= total, "mem_get_info")
    with tempfile.TemporaryDirectory() as folder:
        torch.save({"w": torch.ones(3)}, Path(folder) / "ckpt.pt")
        state = torch.load(Path(folder) / "ckpt.pt", map_location="cuda:0")
    check(state["w"].sum().item() == 3.0, "checkpoint")
    with torch.device("cuda"):
        bias = torch.zeros(8)
    model = nn.DataParallel(nn.Linear(8, 8).cuda(), device_ids=[0])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.cuda.amp.GradScaler()
    check(scaler.is_enabled(), "GradScaler enabled")
    side = torch.cuda.Stream()
    loader = DataLoader(TensorDataset(torch.randn(256, 8)), batch_size=16, num_workers=workers, pin_memory=True,
                        collate_fn=to_gpu)
    for _epoch in range(100):
        for batch in loader:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.cuda.nvtx.range_push("step")
            with torch.cuda.stream(side):
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.amp.autocast():
                    out = model(batch + bias)
                check(out.dtype == torch.float16, "float16 autocast")
                loss = out.float().pow(2).mean()
            torch.cuda.current_stream().wait_stream(side)
            optimizer.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            torch.cuda.nvtx.range_pop()
            end.record()
            torch.cuda.synchronize()
            check(start.elapsed_time(end) >= 0.0, "event timing")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 0)

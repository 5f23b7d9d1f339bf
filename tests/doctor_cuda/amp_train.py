"""A CUDA training loop with automatic mixed precision, written for one GPU (the shape of PyTorch's AMP recipe):
the model moved with .to("cuda"), batches from pinned memory copied without waiting, float16 autocast, GradScaler
and AdamW. ``--fused`` steps a fused AdamW, which takes GradScaler's inf check on the device."""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Noise(Dataset):
    def __len__(self):
        return 4096

    def __getitem__(self, index):
        generator = torch.Generator().manual_seed(index)
        return torch.randn(64, generator=generator), torch.randint(0, 10, (), generator=generator)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--fused", action="store_true")
    args = parser.parse_args()
    device = "cuda"
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=args.fused)
    scaler = torch.amp.GradScaler("cuda")
    loader = DataLoader(Noise(), batch_size=32, shuffle=True, pin_memory=True)
    for _epoch in range(100):
        for features, labels in loader:
            features = features.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            with torch.autocast("cuda", dtype=torch.float16):
                logits = model(features)
                loss = nn.functional.cross_entropy(logits, labels)
            optimizer.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()


if __name__ == "__main__":
    main()

"""A CUDA script whose compiled loss moves its input to the GPU and draws noise there: under --cuda-on-cpu the
mapping's mode is traced into the graph (no graph break, no recompile)."""

import torch
from torch import nn

model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).to("cuda")
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)


@torch.compile(backend="eager")
def noisy_loss(features, labels):
    features = features.to("cuda")
    noise = torch.randn(features.shape, device="cuda")
    return nn.functional.cross_entropy(model(features + 0.01 * noise), labels)


for _step in range(1000):
    labels = torch.randint(0, 4, (8,)).cuda()
    loss = noisy_loss(torch.randn(8, 16), labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

"""A CUDA script that captures its step in a CUDA graph, which --cuda-on-cpu does not map onto the CPU."""

import torch

model = torch.nn.Linear(8, 8).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
static = torch.randn(4, 8, device="cuda")
graph = torch.cuda.CUDAGraph()
for _step in range(100):
    optimizer.zero_grad()
    model(static).sum().backward()
    optimizer.step()

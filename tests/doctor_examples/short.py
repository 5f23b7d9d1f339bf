"""A script that trains for ``--steps`` steps and ends, each step reading its loss with ``.item()`` (as PyTorch's
time_sequence_prediction does, with ``--steps 10``)."""

import argparse

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, required=True)
steps = parser.parse_args().steps
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(steps):
    loss = model(torch.randn(8, 4)).square().mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(loss.item())  # the step's sync

"""The plant of a rule registered from outside the package (tests/doctor_plugin_rule.py): a full sort for the top
three values, and its twin with topk."""

import argparse

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--device", default="cpu")
device = torch.device(parser.parse_args().device)
model = torch.nn.Linear(8, 16).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
while True:
    scores = model(torch.randn(4, 8, device=device)).sum(0)
    best = torch.sort(scores, descending=True).values[:3]  # planted: a full sort for three values
    top = torch.topk(scores, 3).values  # right: topk
    optimizer.zero_grad()
    (best.sum() + top.sum()).backward()
    optimizer.step()

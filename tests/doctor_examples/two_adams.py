"""A GAN's loop: two models, each with its own Adam, stepped one after the other in every step.

Label, from torch/optim/adam.py (``_init_group``): "Deliberately host `step` on CPU if both capturable and fused
are off": each Adam makes its ``state["step"]`` with ``torch.tensor(0.0, ..., device="cpu")`` at its first step,
and reading it is no sync on a GPU. So neither ``step()`` line syncs, the second optimizer's (whose first step
comes after the first optimizer ended the doctor's first step) no more than the first's.

Run as ``python two_adams.py``; it trains until it is stopped.
"""

from __future__ import annotations

import torch

NOISE, FEATURES = 4, 8


def main() -> None:
    torch.manual_seed(0)
    generator = torch.nn.Sequential(torch.nn.Linear(NOISE, 16), torch.nn.ReLU(), torch.nn.Linear(16, FEATURES))
    critic = torch.nn.Sequential(torch.nn.Linear(FEATURES, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer_d = torch.optim.Adam(critic.parameters(), lr=1e-3)
    optimizer_g = torch.optim.Adam(generator.parameters(), lr=1e-3)
    real = torch.randn(32, FEATURES)
    while True:
        fake = generator(torch.randn(32, NOISE))
        critic.zero_grad()
        (critic(fake.detach()).mean() - critic(real).mean()).backward()
        optimizer_d.step()  # the critic's step: no sync
        generator.zero_grad()
        (-critic(fake).mean()).backward()
        optimizer_g.step()  # the generator's step: no sync


if __name__ == "__main__":
    main()

"""A step that also evaluates under ``torch.inference_mode()`` and reads its loss with ``.item()``, as timm's
``validate`` does.

Label, from aten/src/ATen/native/Scalar.cpp (``item`` returns ``_local_scalar_dense``, which copies the one value
to the host: on a GPU the host waits) and c10/core/InferenceMode.h (inference mode leaves out the autograd keys, so
a dispatch mode meets ``aten.item`` whole): one ``.item()`` sync a step at the evaluation's line, named as the
``.item()`` it is.

Run as ``python inference_item.py``; it trains until it is stopped.
"""

from __future__ import annotations

import torch


def main() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    x, held_out, seen = torch.randn(16, 8), torch.randn(4, 8), 0.0
    while True:
        loss = model(x).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        with torch.inference_mode():
            seen += model(held_out).square().mean().item()  # the evaluation's sync


if __name__ == "__main__":
    main()

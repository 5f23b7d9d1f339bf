"""A batch's digest: the bytes, shape and dtype of each tensor in it, hashed, to tell two runs' batches apart."""

from __future__ import annotations

import hashlib
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

__all__ = ["batch_digest"]


def batch_digest(batch: Any) -> str:
    """The SHA-256 of a batch: each tensor's dtype, shape and bytes, and each other leaf's repr, in order.

    Args:
        batch: a tensor, or a structure of them (a tuple, a dict) as a DataLoader delivers it.

    Returns:
        The hex digest.
    """
    digest = hashlib.sha256()
    for leaf in tree_flatten(batch)[0]:
        if isinstance(leaf, torch.Tensor):
            flat = leaf.detach().cpu().contiguous().reshape(-1)
            digest.update(f"{leaf.dtype}{tuple(leaf.shape)}".encode())
            digest.update(flat.view(torch.uint8).numpy().tobytes())
        else:
            digest.update(repr(leaf).encode())
    return digest.hexdigest()

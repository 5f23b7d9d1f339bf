"""The loader ladder's variants: their names, the groups the other modules branch on, and the bytes each ships
(a batch as it is handed over, and the memory estimate of a case)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor

from pitfalls.family import FLOOR

VARIANTS = ("naive", "offline", "ram_encoded", "ram_decoded", "uint8", "host_decode", "gpu_decode")
# The steps that deliver uint8 and normalize on the device; they pin their batches on a CUDA device by default.
DEVICE_NORMALIZED = frozenset({"uint8", "host_decode", "gpu_decode", FLOOR})
RAM_VARIANTS = frozenset({"ram_encoded", "ram_decoded", "uint8", "host_decode", "gpu_decode"})
# The rungs that ship JPEG bytes from RAM: they differ only in where the decoder runs.
JPEG_VARIANTS = frozenset({"host_decode", "gpu_decode"})
# The rungs that read files on every access: the only ones a cold page cache changes.
FILE_VARIANTS = frozenset({"naive", "offline"})
CACHES = ("warm", "cold")

# Per worker process in the memory estimate: a forked worker's own heap, queues and buffers.
WORKER_OVERHEAD_BYTES = 128 * 2**20


def batch_bytes(variant: str, batch: int, image_size: int) -> int:
    """Bytes of one host batch as a variant ships it (gpu_decode: its decoded size, an upper bound)."""
    pixels = batch * image_size * image_size
    if variant in DEVICE_NORMALIZED:
        return pixels * (3 + 1)  # uint8 image, uint8 mask
    return pixels * (3 * 4 + 8)  # float32 image, int64 mask


def nbytes(batch: Any) -> int:
    """Bytes of the tensors of a batch, exactly (lists and tuples of tensors)."""
    if isinstance(batch, Tensor):
        return batch.nelement() * batch.element_size()
    return sum(nbytes(part) for part in batch)


def estimate(params: Mapping[str, Any]) -> int:
    """Peak host bytes of a case, before anything is allocated: the data in RAM, the batches in flight and being
    made, the model step, and each worker's own overhead (the largest variant's figures, whichever it is)."""
    size, batch, workers = params["image_size"], params["batch"], params["num_workers"]
    pixels = size * size
    data = params["items"] * pixels * 4  # decoded uint8 image + mask per item (encoded is smaller)
    host_batch = batch_bytes("naive", batch, size)
    in_flight = (workers * params["prefetch_factor"] + 2) * host_batch
    # Each producer decodes one source item at a time and holds one batch of items before collating it.
    making = max(workers, 1) * (host_batch + 4 * pixels * params["source_scale"] ** 2)
    step = batch * pixels * (3 * 4 * 2 + 8 + params["classes"] * 4 * 3)
    return data + in_flight + making + step + workers * WORKER_OVERHEAD_BYTES


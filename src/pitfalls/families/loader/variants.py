"""The loader ladder's variant names and the groups the other modules branch on."""

from __future__ import annotations

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

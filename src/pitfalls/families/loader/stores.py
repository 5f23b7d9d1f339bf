"""How the RAM variants hold their items: a Python list of per-item objects, or packed buffers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def packed(items: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """Variable-length items as (offsets, one uint8 buffer): item i is ``buffer[offsets[i]:offsets[i + 1]]``."""
    sizes = np.fromiter((len(item) for item in items), dtype=np.int64, count=len(items))
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64), np.frombuffer(b"".join(items), dtype=np.uint8)


class ListStore:
    """The article's form: a Python list with one object per item (``bytes`` or an array).

    In a forked worker, reading an item increments the object's reference count, which writes to the page
    holding it: the page is copied into the worker (copy-on-write), one page or more per item read.
    """

    def __init__(self, items: list[Any]) -> None:
        self.items = items

    def __getitem__(self, index: int) -> Any:
        return self.items[index]


class PackedBytes:
    """Variable-length items in one uint8 buffer with an offsets array: two objects, whatever the item count."""

    def __init__(self, items: Sequence[bytes]) -> None:
        self.offsets, self.buffer = packed(items)

    def __getitem__(self, index: int) -> np.ndarray:
        return self.buffer[self.offsets[index]:self.offsets[index + 1]]


class PackedArrays:
    """Same-shape items in one array [N, ...]."""

    def __init__(self, items: Sequence[np.ndarray]) -> None:
        self.array = np.stack(items)

    def __getitem__(self, index: int) -> np.ndarray:
        return self.array[index]


Store = ListStore | PackedBytes | PackedArrays


def make_store(items: list[Any], storage: str) -> Store:
    """Hold items as a Python list (``storage="list"``) or packed into one buffer (``"packed"``)."""
    if storage == "list":
        return ListStore(items)
    if storage != "packed":
        raise ValueError(f"storage={storage!r} is not allowed; allowed: list, packed")
    return PackedBytes(items) if items and isinstance(items[0], bytes) else PackedArrays(items)


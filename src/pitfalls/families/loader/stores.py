"""How the RAM variants hold their items: a Python list of per-item objects, or packed buffers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


class ListStore:
    """The article's form: a Python list with one object per item (``bytes`` or an array).

    In a forked worker, reading an item increments the object's reference count, which writes to the page
    holding it: the page is copied into the worker (copy-on-write), one page or more per item read.
    """

    def __init__(self, items: list[Any]) -> None:
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> Any:
        return self.items[index]

    @property
    def nbytes(self) -> int:
        return sum(len(item) if isinstance(item, bytes) else item.nbytes for item in self.items)


class PackedBytes:
    """Variable-length items in one uint8 buffer with an offsets array: two objects, whatever the item count."""

    def __init__(self, items: Sequence[bytes]) -> None:
        sizes = np.fromiter((len(item) for item in items), dtype=np.int64, count=len(items))
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.buffer = np.frombuffer(b"".join(items), dtype=np.uint8)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, index: int) -> np.ndarray:
        return self.buffer[self.offsets[index]:self.offsets[index + 1]]

    @property
    def nbytes(self) -> int:
        return int(self.buffer.nbytes + self.offsets.nbytes)


class PackedArrays:
    """Same-shape items in one array [N, ...]."""

    def __init__(self, items: Sequence[np.ndarray]) -> None:
        self.array = np.stack(items)

    def __len__(self) -> int:
        return len(self.array)

    def __getitem__(self, index: int) -> np.ndarray:
        return self.array[index]

    @property
    def nbytes(self) -> int:
        return int(self.array.nbytes)


Store = ListStore | PackedBytes | PackedArrays


def make_store(items: list[Any], storage: str) -> Store:
    """Hold items as a Python list (``storage="list"``) or packed into one buffer (``"packed"``)."""
    if storage == "list":
        return ListStore(items)
    if storage != "packed":
        raise ValueError(f"storage={storage!r} is not allowed; allowed: list, packed")
    return PackedBytes(items) if items and isinstance(items[0], bytes) else PackedArrays(items)


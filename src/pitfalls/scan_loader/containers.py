"""The dataset's Python-object containers, and what touching each one copies in a forked worker (issue 13246).

Reading a Python object writes its reference count, so its page is copied into every forked worker that reads it.
Packed arrays (numpy, tensors, Arrow) are a few objects whatever their length and are not listed.
"""

from __future__ import annotations

import functools
import itertools
import multiprocessing
import sys
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import psutil

from pitfalls.scan_loader.interrupts import ignore_in_child

__all__ = ["Container", "find_containers", "touch_copied_bytes"]

_KINDS = (list, tuple, dict, set, frozenset, deque)
_SAMPLE = 64
_DEPTH = 4


@dataclass(frozen=True)
class Container:
    """One container of Python objects held by the dataset.

    Attributes:
        name: its attribute path, e.g. ``dataset.records``.
        kind: its type name.
        length: its items.
        bytes: an estimate of the Python objects it holds (items sampled, deep sizes summed).
    """

    name: str
    kind: str
    length: int
    bytes: int


def _deep_size(value: Any, depth: int = _DEPTH) -> int:
    size = sys.getsizeof(value)
    if depth == 0:
        return size
    if isinstance(value, dict):
        return size + sum(_deep_size(k, depth - 1) + _deep_size(v, depth - 1) for k, v in value.items())
    if isinstance(value, _KINDS):
        return size + sum(_deep_size(item, depth - 1) for item in value)
    if hasattr(value, "__dict__") and not isinstance(value, type):
        return size + _deep_size(vars(value), depth - 1)
    return size


def _items(value: Any) -> list[Any]:
    items = list(value.values()) if isinstance(value, dict) else value
    if isinstance(items, (list, tuple)):
        return list(items[::max(1, len(items) // _SAMPLE)][:_SAMPLE])
    return list(itertools.islice(items, _SAMPLE))


def _estimate(value: Any) -> int:
    sample = _items(value)
    if not sample:
        return sys.getsizeof(value)
    return sys.getsizeof(value) + sum(_deep_size(item) for item in sample) * len(value) // len(sample)


def find_containers(dataset: Any, *, limit: int = 3) -> list[Container]:
    """The largest containers of two or more Python objects among the dataset's attributes (and a wrapped dataset's).

    Args:
        dataset: the user's dataset.
        limit: how many to return, largest first.

    Returns:
        The containers, by estimated bytes.
    """
    found: list[Container] = []
    pending: list[tuple[str, Any, int]] = [("dataset", dataset, 0)]
    seen: set[int] = set()
    while pending:
        name, value, depth = pending.pop()
        if id(value) in seen or depth > 2:
            continue
        seen.add(id(value))
        for attribute, held in vars(value).items() if hasattr(value, "__dict__") else ():
            path = f"{name}.{attribute}"
            if isinstance(held, _KINDS) and len(held) >= 2:
                found.append(Container(path, type(held).__name__, len(held), _estimate(held)))
            elif hasattr(held, "__getitem__") and hasattr(held, "__dict__") and not isinstance(held, type):
                pending.append((path, held, depth + 1))  # a wrapped dataset (Subset, ConcatDataset's parts)
    return sorted(found, key=lambda c: c.bytes, reverse=True)[:limit]


def _touch(value: Any) -> None:
    for item in value.values() if isinstance(value, dict) else value:
        if isinstance(item, dict):
            for inner in item.values():
                del inner
        elif hasattr(item, "__dict__"):
            for inner in vars(item).values():
                del inner
        del item


def _child(root: Any, path: str, queue: Any) -> None:
    ignore_in_child()
    me = psutil.Process()
    before = me.memory_full_info().uss
    _touch(functools.reduce(getattr, path.split(".")[1:], root))
    queue.put(me.memory_full_info().uss - before)


def touch_copied_bytes(dataset: Any, containers: Iterable[Container], timeout_s: float = 60.0) -> dict[str, int]:
    """Bytes a forked process copies by reading every item of each container (its USS growth), one fork each.

    Args:
        dataset: the user's dataset (the root of each container's path).
        containers: from `find_containers`.
        timeout_s: the longest one child may take.

    Returns:
        Container name -> bytes copied; a container whose child failed is left out.
    """
    context = multiprocessing.get_context("fork")
    copied: dict[str, int] = {}
    for container in containers:
        queue = context.SimpleQueue()
        child = context.Process(target=_child, args=(dataset, container.name, queue), daemon=True)
        child.start()
        child.join(timeout_s)
        if child.is_alive():
            child.kill()
            child.join()
            continue
        if child.exitcode == 0 and not queue.empty():
            copied[container.name] = int(queue.get())
    return copied

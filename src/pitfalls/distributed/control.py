"""The control channel of a rank group: a ``TCPStore`` listening on 127.0.0.1 only, keyed by a per-run secret.

A plain ``TCPStore("127.0.0.1", 0, is_master=True)`` listens on every interface whatever host it is given; one
built on a socket that is already bound to 127.0.0.1 and listening (``master_listen_fd``) listens there only, and
takes the descriptor over. The same store serves as the ranks' rendezvous (``TORCHELASTIC_USE_AGENT_STORE``), so
no rank opens a store of its own.

The store has no authentication and no way to list its keys: every key of a run starts with a random secret
that reaches the ranks in their environment (readable by their owner only, unlike a command line), so another
local user who finds the port cannot guess where to write a command.
"""

from __future__ import annotations

import contextlib
import datetime
import socket
from collections.abc import Iterator
from typing import Any

import torch.distributed
from torch.distributed import TCPStore

__all__ = ["CONTROL_ENV", "LAUNCHER_ENV", "LOOPBACK", "PART_BYTES", "SECRET_ENV", "get_value",
           "loopback_store", "loopback_stores", "set_value"]

LOOPBACK = "127.0.0.1"
CONTROL_ENV = "PITFALLS_GROUP_CONTROL"
SECRET_ENV = "PITFALLS_GROUP_SECRET"
LAUNCHER_ENV = "PITFALLS_GROUP_LAUNCHER"
# The most a value is sent in one store message: torch's store refuses a client message above 8 MiB ("Invalid
# payload size"), and a rank's weights and momentum (the gate's ``state``) of a 25 MiB net in float64 are 105 MB.
PART_BYTES = 4 * 2**20
# What stands under a key whose value was written in parts: the marker, then the number of parts.
_PARTS = b"\0pitfalls-parts:"


def _listening(port: int = 0) -> tuple[int, int]:
    """A socket bound to 127.0.0.1 and listening, as (its descriptor, its port): port 0 is the kernel's pick (no
    race for it). The store it is given to owns the descriptor: closing the Python socket would close it there."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind((LOOPBACK, port))
    listener.listen(128)
    picked = int(listener.getsockname()[1])
    return listener.detach(), picked


def loopback_store(timeout_s: float) -> TCPStore:
    """A master ``TCPStore`` that listens on 127.0.0.1 only, on a port the kernel picked.

    Args:
        timeout_s: the store's default timeout for ``get`` and ``wait``.
    """
    fd, port = _listening()
    return TCPStore(LOOPBACK, port, is_master=True, wait_for_workers=False,
                    timeout=datetime.timedelta(seconds=timeout_s), master_listen_fd=fd)


@contextlib.contextmanager
def loopback_stores() -> Iterator[None]:
    """Inside the block, every master ``TCPStore`` this process makes through ``torch.distributed.TCPStore`` (and the
    c10d rendezvous backend's own name for it) listens on 127.0.0.1 only: torchrun's agent makes its stores so, and
    whatever host it is given they would listen on every interface."""
    from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend

    original = torch.distributed.TCPStore

    def on_loopback(host_name: str, port: int = 0, *args: Any, **kwargs: Any) -> TCPStore:
        if kwargs.get("is_master") and kwargs.get("master_listen_fd") is None:
            kwargs["master_listen_fd"], port = _listening(port)
            host_name = LOOPBACK
        return original(host_name, port, *args, **kwargs)

    torch.distributed.TCPStore = on_loopback  # type: ignore[misc,assignment]
    c10d_rendezvous_backend.TCPStore = on_loopback  # type: ignore[misc,assignment]
    try:
        yield
    finally:
        torch.distributed.TCPStore = original  # type: ignore[misc]
        c10d_rendezvous_backend.TCPStore = original  # type: ignore[misc]


def set_value(store: TCPStore, key: str, value: bytes) -> None:
    """Write ``value`` under ``key``; a value above `PART_BYTES` goes in parts (``key/part/i``) first, then a marker
    with their count under ``key``, so that a reader that finds ``key`` finds every part."""
    if len(value) <= PART_BYTES and not value.startswith(_PARTS):
        store.set(key, value)  # type: ignore[arg-type]  # the store takes bytes; its stub says str
        return
    starts = range(0, len(value), PART_BYTES)
    for index, start in enumerate(starts):
        store.set(f"{key}/part/{index}", value[start:start + PART_BYTES])  # type: ignore[arg-type]
    store.set(key, _PARTS + str(len(starts)).encode())  # type: ignore[arg-type]


def get_value(store: TCPStore, key: str) -> bytes:
    """The value `set_value` wrote under ``key``, its parts joined (and then deleted from the store)."""
    value = store.get(key)
    if not value.startswith(_PARTS):
        return value
    keys = [f"{key}/part/{index}" for index in range(int(value[len(_PARTS):]))]
    parts = [store.get(part) for part in keys]
    for part in keys:
        store.delete_key(part)
    return b"".join(parts)

"""Ctrl-C during a scan ends it with one line, wherever it lands.

Python raises ``KeyboardInterrupt`` at the next bytecode of the main thread, which may be inside a finalizer (a
``__del__`` of the user's, DataLoader's own iterator shutting down): there it is printed as "Exception ignored" and
lost, and the scan would go on to exit 0. So the handler also remembers the signal, and the scan raises it again at
its next batch (`raise_if_received`) and before it reports. A terminal's Ctrl-C reaches the whole foreground group:
the scan's workers and probe children ignore it (`ignore_in_child`) and are stopped by the scan, so that none dies
half-way through handing a batch over.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import traceback
from collections.abc import Iterator
from types import FrameType, TracebackType
from typing import Any

__all__ = ["ignore_in_child", "raise_if_received", "recorded"]

_received = False


def raise_if_received() -> None:
    """Raise ``KeyboardInterrupt`` if a SIGINT arrived inside `recorded` (one a finalizer swallowed included)."""
    if _received:
        raise KeyboardInterrupt


def _handler(_signum: int, _frame: FrameType | None) -> None:
    global _received
    first = not _received
    _received = True
    if first:  # a second Ctrl-C must not cut short the clean-up the first one started
        raise KeyboardInterrupt


def _unraisable(previous: Any) -> Any:
    def hook(unraisable: Any) -> None:
        # The interrupt is remembered by the handler: its "Exception ignored" report is not the user's to read.
        if not (_received and isinstance(unraisable.exc_value, KeyboardInterrupt)):
            previous(unraisable)

    return hook


@contextlib.contextmanager
def recorded() -> Iterator[None]:
    """SIGINT raises ``KeyboardInterrupt`` as usual and is remembered for `raise_if_received` (main thread only; a
    SIGINT the process was started ignoring, as under ``nohup``, stays ignored)."""
    global _received
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        yield
        return
    _received = False
    previous = signal.signal(signal.SIGINT, _handler)
    hook, sys.unraisablehook = sys.unraisablehook, _unraisable(sys.unraisablehook)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        sys.unraisablehook = hook


def _abandoned_handover(kind: type[BaseException], tb: TracebackType | None) -> bool:
    # multiprocessing's resource sharer hands a batch's file descriptors to the main process over a connection; a
    # main process interrupted while fetching them drops it, and the worker's server thread prints the reset.
    files = [frame.f_code.co_filename for frame, _ in traceback.walk_tb(tb)]
    return issubclass(kind, (ConnectionError, EOFError)) and any(f.endswith("resource_sharer.py") for f in files)


def ignore_in_child() -> None:
    """In a worker or probe child of the scan: ignore Ctrl-C (the scan stops its children) and stay quiet about a
    batch hand-over the interrupted main process abandoned."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    previous = sys.excepthook

    def hook(kind: type[BaseException], error: BaseException, tb: TracebackType | None) -> None:
        if not _abandoned_handover(kind, tb):
            previous(kind, error, tb)

    sys.excepthook = hook

"""A job's private staging folder, and the clean-up of folders left by jobs that were killed.

asv writes into a copy of results/ inside the staging folder, and its temporary files (the forkserver's socket
folder, each benchmark's scratch folder) go there too through TMPDIR (or, under a path too deep for a socket, to a
folder of the system's temporary directory that the staging folder names), so removing the folder removes every
trace of the run. While the job lives it holds an exclusive ``flock`` on ``<folder>/alive``; the lock dies with the
process, however it dies, so the next job can tell a folder of a killed job from one of a job still running,
without trusting PIDs that the system may have reused.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from pitfalls.runner.processes import stop

__all__ = ["Stage", "remove_stale"]

ALIVE = "alive"
YOUNG_S = 60.0
# Where TMPDIR went when the staging folder's own path was too long (its path, one line).
ELSEWHERE = "tmpdir"
# asv's forkserver binds a socket at TMPDIR/asv-forkserver-XXXXXXXX/socket; a Unix socket's path holds at most
# 107 bytes, and a deep checkout (a CI workspace, pytest's tmp folders) passes that inside its staging folder.
SOCKET_TAIL = len("/asv-forkserver-XXXXXXXX/socket")
UNIX_PATH_MAX = 107


ELSEWHERE_PREFIX = "pitfalls-run-"
# The roots tried for a TMPDIR kept elsewhere, after the system's temporary directory: a batch job's TMPDIR is often
# its own deep scratch folder (a Slurm task's, pytest's), itself too deep for the socket.
SHORT_ROOTS = ("/tmp", "/var/tmp", "/dev/shm")


def _socket_fits(folder: str | os.PathLike[str]) -> bool:
    return len(os.fsencode(folder)) + SOCKET_TAIL <= UNIX_PATH_MAX


def short_temporary_root(candidates: tuple[str, ...] | None = None) -> str:
    """The first writable temporary directory in which a stage's TMPDIR leaves room for asv's forkserver socket.

    Args:
        candidates: the directories tried, in order; None means the system's temporary directory, then
            `SHORT_ROOTS`.

    Raises:
        RuntimeError: none of them is both short enough and writable (the message names each and its length).
    """
    tried = [tempfile.gettempdir(), *SHORT_ROOTS] if candidates is None else list(candidates)
    tail = f"/{ELSEWHERE_PREFIX}XXXXXXXX"
    for root in tried:
        if _socket_fits(root + tail) and os.path.isdir(root) and os.access(root, os.W_OK | os.X_OK):
            return root
    raise RuntimeError(
        f"no temporary directory leaves room for asv's forkserver socket ({UNIX_PATH_MAX} bytes at most); tried "
        + ", ".join(f"{root} ({len(os.fsencode(root))} bytes)" for root in tried)
        + ": set TMPDIR to a short writable folder")


def _held_by_a_live_job(folder: Path) -> bool:
    try:
        fd = os.open(folder / ALIVE, os.O_RDWR)
    except OSError:
        # No lock file yet: a job between creating its folder and locking it, unless the folder is old.
        try:
            return time.time() - folder.stat().st_mtime < YOUNG_S
        except OSError:
            return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def remove_stale(root: str | os.PathLike[str], log: Callable[[str], None]) -> list[Path]:
    """Remove the staging folders under ``root`` whose job is dead, stopping any process it left behind.

    Returns:
        The folders removed.
    """
    removed: list[Path] = []
    folder_root = Path(root)
    if not folder_root.is_dir():
        return removed
    for folder in sorted(folder_root.iterdir()):
        if not folder.is_dir() or _held_by_a_live_job(folder):
            continue
        left = stop(str(folder))
        note = f", stopped {len(left)} process(es) it left running" if left else ""
        log(f"removing {folder}: the staging folder of an earlier run that was killed (never merged){note}")
        _remove_tmp_elsewhere(folder)
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed


def _remove_tmp_elsewhere(folder: Path) -> None:
    """Remove the TMPDIR a staging folder keeps outside itself (see `Stage`), if it has one."""
    try:
        elsewhere = Path((folder / ELSEWHERE).read_text().strip())
    except OSError:
        return
    if elsewhere.name.startswith(ELSEWHERE_PREFIX):  # only a folder a stage made
        shutil.rmtree(elsewhere, ignore_errors=True)


class Stage:
    """One job's staging folder under ``root``: ``results/`` for asv, ``tmp/`` for TMPDIR, and the alive lock.

    Used as a context manager: entering creates the folder and takes the lock, leaving removes the folder. Where
    ``tmp/`` would be too deep for asv's forkserver socket, TMPDIR is a short folder of the system's temporary
    directory instead, named in the staging folder so that whoever removes the stage removes it too.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.path = self.root / f"run-{os.getpid()}"
        self.results = self.path / "results"
        self.tmp = self.path / "tmp"
        self._lock_fd: int | None = None

    @property
    def marker(self) -> str:
        """The ``PITFALLS_RUN`` value of every process this job starts."""
        return str(self.path)

    def __enter__(self) -> Stage:
        self.root.mkdir(parents=True, exist_ok=True)
        if self.path.exists():  # a folder of a dead process whose PID this one reuses
            shutil.rmtree(self.path)
        self.path.mkdir()
        self._lock_fd = os.open(self.path / ALIVE, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        if _socket_fits(self.tmp):
            self.tmp.mkdir()
        else:
            self.tmp = Path(tempfile.mkdtemp(prefix=ELSEWHERE_PREFIX, dir=short_temporary_root()))
            (self.path / ELSEWHERE).write_text(f"{self.tmp}\n")
        return self

    def remove(self) -> None:
        """Delete the folder and release the lock (safe to call twice)."""
        _remove_tmp_elsewhere(self.path)
        shutil.rmtree(self.path, ignore_errors=True)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.remove()

"""Start asv so that every process it spawns can be found and stopped, even after asv itself is gone.

asv runs in its own process group, its forkserver in another (asv starts it with ``setpgid``), and the benchmark
children fork from that server: killing one group, or asv's PID, leaves the rest running (a killed main job used to
leave asv measuring for about 100 s under PID 1). So every process a job starts carries ``PITFALLS_RUN=<the job's
staging folder>``, which its descendants inherit; the job (or the next one, after a SIGKILL) finds them by it and
stops their groups through the one launcher, `pitfalls.processes`.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import psutil

from pitfalls import processes as launcher

__all__ = ["MARKER", "run_processes", "start", "stop"]

MARKER = "PITFALLS_RUN"


def start(command: Sequence[str], *, marker: str, env: Mapping[str, str] | None = None,
          **popen: Any) -> subprocess.Popen:
    """Start ``command`` in a session of its own (`pitfalls.processes.start`) with ``PITFALLS_RUN=marker``."""
    return launcher.start(command, env={**(os.environ if env is None else env), MARKER: marker}, **popen)


def run_processes(marker: str) -> list[psutil.Process]:
    """Every live process whose environment holds ``PITFALLS_RUN=marker`` (this process excluded)."""
    # One whose environment cannot be read (another user's, a zombie) has None there: not the run's.
    return [process for process in psutil.process_iter(["environ"]) if process.pid != os.getpid()
            and (process.info["environ"] or {}).get(MARKER) == marker and launcher.alive(process)]


def stop(marker: str, *, grace_s: float = launcher.GRACE_S, extra: Iterable[subprocess.Popen] = ()) -> list[int]:
    """Stop every process of the run ``marker`` with its process group (`pitfalls.processes.stop`).

    Args:
        marker: the run's ``PITFALLS_RUN`` value.
        grace_s: how long the processes get to exit after SIGTERM.
        extra: this job's own children, reaped once stopped so none is left as a zombie.

    Returns:
        The PIDs that were signalled.
    """
    return launcher.stop(extra, grace_s=grace_s, found=lambda: run_processes(marker))

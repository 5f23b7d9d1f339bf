"""Start asv so that every process it spawns can be found and stopped, even after asv itself is gone.

asv runs in its own process group, and its forkserver in another one (asv starts it with ``setpgid``), and the
benchmark children fork from that server: killing one group, or asv's PID, leaves the rest running (a killed
main job used to leave asv measuring for about 100 s under PID 1). Every process a job starts therefore carries
one environment variable, ``PITFALLS_RUN=<the job's staging folder>``, which every descendant inherits; the job
(or the next job, for a run that was killed with SIGKILL) finds them by it and stops their process groups.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence

import psutil

__all__ = ["MARKER", "run_processes", "start", "stop"]

MARKER = "PITFALLS_RUN"


def start(command: Sequence[str], *, marker: str, env: Mapping[str, str] | None = None, **kwargs) -> subprocess.Popen:
    """Start ``command`` in a new session (its own process group) with ``PITFALLS_RUN=marker`` in its environment.

    A new session also keeps a terminal's Ctrl-C away from it: the job decides how asv is stopped.
    """
    environ = dict(os.environ if env is None else env)
    environ[MARKER] = marker
    return subprocess.Popen(list(command), env=environ, start_new_session=True, **kwargs)


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def run_processes(marker: str) -> list[psutil.Process]:
    """Every live process whose environment holds ``PITFALLS_RUN=marker`` (this process excluded)."""
    found = []
    for process in psutil.process_iter():
        if process.pid == os.getpid():
            continue
        try:
            if process.environ().get(MARKER) == marker and _alive(process):
                found.append(process)
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess, OSError):
            continue
    return found


def _signal_groups(processes: Iterable[psutil.Process], signum: int) -> None:
    own = os.getpgid(0)
    groups = set()
    for process in processes:
        try:
            groups.add(os.getpgid(process.pid))
        except ProcessLookupError:
            continue
    for group in groups - {own}:
        try:
            os.killpg(group, signum)
        except (ProcessLookupError, PermissionError):
            continue
    # A process left in this job's own group (none is started there) is signalled alone.
    for process in processes:
        try:
            if os.getpgid(process.pid) == own:
                process.send_signal(signum)
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue


def stop(marker: str, *, grace_s: float = 5.0, extra: Iterable[subprocess.Popen] = ()) -> list[int]:
    """Stop every process of the run ``marker``: SIGTERM to their process groups, SIGKILL to what outlives ``grace_s``.

    Args:
        marker: the run's ``PITFALLS_RUN`` value.
        grace_s: how long the processes get to exit after SIGTERM.
        extra: this job's own children, reaped once stopped so none is left as a zombie.

    Returns:
        The PIDs that were signalled.
    """
    children = list(extra)
    processes = run_processes(marker)
    for child in children:
        try:
            processes.append(psutil.Process(child.pid))
        except psutil.NoSuchProcess:
            continue
    pids = sorted({process.pid for process in processes})
    if processes:
        _signal_groups(processes, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(_alive(p) for p in processes):
            for child in children:
                child.poll()
            time.sleep(0.05)
        # Processes that started while the first ones stopped (a fork in flight) are found again by the marker.
        left = [p for p in processes if _alive(p)] + run_processes(marker)
        if left:
            _signal_groups(left, signal.SIGKILL)
    for child in children:
        try:
            child.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
    return pids

"""The one way the suite starts a command it may have to end: a session of its own, a time limit, a group stop.

A command is started in a new session, so it leads a process group that its descendants share (a terminal's Ctrl-C
does not reach it either: its caller decides how it ends). It is stopped by SIGTERM to that group, SIGKILL to the
group after a grace period (what outlives its leader, what ignores SIGTERM), and reaped.

A child's pid names its group only while the child is unreaped or a member lives: a child is watched here without
being reaped (``waitid`` with ``WNOWAIT``) until its group has been killed, and one already reaped elsewhere is
never signalled, so no signal reaches a process that got a reused pid.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psutil

__all__ = ["GRACE_S", "Finished", "alive", "run", "start", "stop"]

GRACE_S = 5.0
# Seconds a killed child gets to be reaped: one stuck in the kernel (a driver call) is left, not waited for forever.
REAP_S = 30.0
_POLL_S = 0.05


@dataclass(frozen=True)
class Finished:
    """How a command that `run` started ended.

    Attributes:
        returncode: its exit status; None when the time limit stopped it.
        stdout: what it wrote to a pipe asked for (None without one), up to its end or its stop.
        stderr: the same for its error output.
    """

    returncode: int | None
    stdout: Any = None
    stderr: Any = None

    @property
    def timed_out(self) -> bool:
        return self.returncode is None


def start(command: Sequence[str], *, env: Mapping[str, str] | None = None, **popen: Any) -> subprocess.Popen:
    """Start ``command`` in a new session: it leads a process group of its own.

    Args:
        command: the program and its arguments.
        env: its whole environment; None gives it this process's.
        popen: more arguments of `subprocess.Popen` (stdin, stdout, stderr, text, cwd...).
    """
    return subprocess.Popen(list(command), env=None if env is None else dict(env), start_new_session=True, **popen)


def run(command: Sequence[str], *, timeout_s: float, grace_s: float = GRACE_S,
        env: Mapping[str, str] | None = None, **popen: Any) -> Finished:
    """Run ``command`` to its end or to ``timeout_s``, whichever comes first; past it, `stop` its group.

    Args:
        command: the program and its arguments.
        timeout_s: seconds it may run.
        grace_s: seconds between SIGTERM and SIGKILL when it is stopped.
        env: its whole environment; None gives it this process's.
        popen: more arguments of `subprocess.Popen` (pipes for output it returns).

    Returns:
        Its exit status and output; a None status when the time limit stopped it (with what it wrote until then).
    """
    child = start(command, env=env, **popen)
    try:
        out, err = child.communicate(timeout=max(timeout_s, 0.0))
    except subprocess.TimeoutExpired:
        stop([child], grace_s=grace_s)
        return Finished(None, *(child.communicate() if child.returncode is not None else (None, None)))
    except BaseException:
        stop([child], grace_s=grace_s)  # the caller's Ctrl-C: the command goes with it
        raise
    return Finished(child.returncode, out, err)


def alive(process: psutil.Process) -> bool:
    """Whether ``process`` still runs (a zombie does not)."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _exited(child: subprocess.Popen) -> bool | None:
    """Whether ``child`` has exited, leaving it unreaped; None once it has been reaped (its pid may be another's)."""
    if child.returncode is not None:
        return None
    try:
        return os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:  # another thread's wait reaped it
        return None


def _signal(children: Sequence[subprocess.Popen], others: Iterable[psutil.Process], signum: int) -> None:
    own = os.getpgid(0)
    groups = {child.pid for child in children if _exited(child) is not None}
    alone = []
    for process in others:
        try:
            group = os.getpgid(process.pid)
        except ProcessLookupError:
            continue
        if group == own:
            alone.append(process)  # never this process's own group: such a process is signalled by itself
        else:
            groups.add(group)
    for group in groups - {own}:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signum)
    for process in alone:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.send_signal(signum)


def stop(children: Iterable[subprocess.Popen] = (), *, grace_s: float = GRACE_S,
         found: Callable[[], Iterable[psutil.Process]] = tuple) -> list[int]:
    """Stop ``children`` and the processes ``found`` finds: SIGTERM to their process groups, SIGKILL after ``grace_s``.

    Args:
        children: processes started by `start`; each is reaped before this returns.
        grace_s: seconds they get to exit after SIGTERM; it ends as soon as all have.
        found: processes this one did not start (asv's forkserver and benchmark processes), looked up again before
            SIGKILL so that one started in the meantime goes too.

    Returns:
        The pids signalled first.
    """
    children, others = list(children), list(found())
    pids = sorted({child.pid for child in children if _exited(child) is not None} | {p.pid for p in others})
    _signal(children, others, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and (any(_exited(c) is False for c in children) or any(map(alive, others))):
        time.sleep(_POLL_S)
    # Every child's group, exited or not: members may outlive their leader.
    _signal(children, [p for p in others if alive(p)] + list(found()), signal.SIGKILL)
    for child in children:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=REAP_S)
    return pids

"""The one launcher: a command in a session of its own, a time limit, SIGTERM then SIGKILL to its process group.

The command leads a process group its descendants share (and a terminal's Ctrl-C does not reach: its caller decides
how it ends). A child's pid names its group only while the child is unreaped or a member lives, so a child is
watched without being reaped (``waitid`` with ``WNOWAIT``) until its group is killed, and one reaped elsewhere is
never signalled: no signal reaches a process that got a reused pid.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import psutil

__all__ = ["GRACE_S", "alive", "run", "start", "stop"]

GRACE_S = 5.0
# Seconds a killed child gets to be reaped: one stuck in the kernel (a driver call) is left, not waited for forever.
REAP_S = 30.0


def start(command: Sequence[str], **popen: Any) -> subprocess.Popen:
    """Start ``command`` in a new session, leading a process group of its own.

    Args:
        command: the program and its arguments.
        popen: more arguments of `subprocess.Popen` (env, stdin, stdout, stderr, text, cwd...).
    """
    return subprocess.Popen(list(command), start_new_session=True, **popen)


def run(command: Sequence[str], *, timeout_s: float, grace_s: float = GRACE_S,
        **popen: Any) -> subprocess.CompletedProcess:
    """`start` ``command`` and wait for it; `stop` it past ``timeout_s``, or when the caller is interrupted.

    Args:
        timeout_s: seconds it may run.
        grace_s: seconds between SIGTERM and SIGKILL when it is stopped.
        command, popen: as for `start` (pipes give the output; ``capture_output=True`` as `subprocess.run` takes it).

    Returns:
        Its status and output, as `subprocess.run`'s.

    Raises:
        subprocess.TimeoutExpired: the time limit stopped it; it holds what the command wrote until then.
    """
    if popen.pop("capture_output", False):  # as subprocess.run takes it
        popen.update(stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    child = start(command, **popen)
    try:
        out, err = child.communicate(timeout=max(timeout_s, 0.0))
    except subprocess.TimeoutExpired:
        stop([child], grace_s=grace_s)
        out, err = child.communicate() if child.returncode is not None else (None, None)
        raise subprocess.TimeoutExpired(child.args, timeout_s, out, err) from None
    except BaseException:
        stop([child], grace_s=grace_s)
        raise
    return subprocess.CompletedProcess(child.args, child.returncode, out, err)


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
    for process in others:
        with contextlib.suppress(ProcessLookupError, psutil.NoSuchProcess):
            if os.getpgid(process.pid) == own:
                process.send_signal(signum)  # one left in this process's own group goes alone
            else:
                groups.add(os.getpgid(process.pid))
    for group in groups - {own}:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signum)


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
        time.sleep(0.05)
    # Every child's group, exited or not: members may outlive their leader.
    _signal(children, [p for p in others if alive(p)] + list(found()), signal.SIGKILL)
    for child in children:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=REAP_S)
    return pids

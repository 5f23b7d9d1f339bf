"""Start a group of ranks once, then drive them one command at a time over a loopback control store.

The benchmark process (asv's, the CLI's) keeps the ranks alive between commands, so what a figure times is the
ranks' work, not process starts. Each rank is a fresh interpreter (nothing is forked, so no CUDA state is
inherited) given torchrun's environment contract, started and stopped with its process group by
`pitfalls.processes`. One store on 127.0.0.1 only (`control`) is both the control channel and the ranks'
rendezvous, and their gloo and nccl sockets are pinned to loopback: torchrun is not used, as its agent's store
listens on every interface. A rank that raises, exits or does not answer in time (it is then sent SIGUSR1 and
writes its stack) ends the run: every rank is stopped and `RankFailed` carries the account. A group never closed
is stopped by a finalizer, and ranks whose driving process is gone exit on their own (`server`).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Sequence
from typing import IO, TypeVar

from torch.distributed import DistStoreError, TCPStore

from pitfalls import processes
from pitfalls.distributed.control import (
    CONTROL_ENV,
    LAUNCHER_ENV,
    LOOPBACK,
    SECRET_ENV,
    get_value,
    loopback_store,
)

__all__ = ["PROCESS_GROUP_TIMEOUT_S", "RankFailed", "RankGroup", "START_TIMEOUT_S", "STEP_TIMEOUT_S"]

# Timeouts nest: a command < the ranks' process group (a collective waiting on a hung peer) < asv's benchmark
# timeout (benchmarks/bench_parallel.py, 600 s), so a hang is ended here, with the hung rank's stack.
STEP_TIMEOUT_S = 120.0
PROCESS_GROUP_TIMEOUT_S = 240.0
# Seconds for every rank to start (interpreter, torch, process group, model) on a loaded 2-core machine.
START_TIMEOUT_S = 180.0
# Seconds a stopping rank gets before the next, harder, step; and a hung rank to write its stack.
STOP_GRACE_S = 10.0
STACK_GRACE_S = 2.0
_LOG_TAIL_LINES = 60
_LOG_TAIL_BYTES = 64 * 1024


G = TypeVar("G", bound="RankGroup")


class RankFailed(RuntimeError):
    """A rank raised, died, or did not report in time; the message holds its error, traceback or stack."""


def _describe_exit(rank: int, pid: int, code: int) -> str:
    if code < 0:
        return f"rank {rank} (pid {pid}) was killed by {signal.Signals(-code).name}"
    return f"rank {rank} (pid {pid}) exited with code {code}"


def _finalize(popens: list[subprocess.Popen[bytes]], logs: list[IO[bytes]]) -> None:
    """Stop what a group left running; at `RankGroup.close` or, if never called, when the group is collected or
    the interpreter exits."""
    processes.stop(popens, grace_s=STOP_GRACE_S)
    for log in logs:
        log.close()


class RankGroup:
    """``world_size`` ranks started once and kept alive; `run` sends them one command.

    Args:
        entry: what each rank runs after ``python``: ``("-m", module)`` or a script path; it calls
            `pitfalls.distributed.serve`.
        world_size: ranks.
        args: the rank's command-line arguments (its configuration; never a secret).
        threads: intra-op threads per rank (OMP_NUM_THREADS).
        start_timeout_s: seconds for every rank to report ready.
        step_timeout_s: seconds for every rank to answer one command.

    Raises:
        RankFailed: a rank failed while starting.
    """

    def __init__(self, entry: Sequence[str], world_size: int, *, args: Sequence[str] = (), threads: int = 1,
                 start_timeout_s: float = START_TIMEOUT_S, step_timeout_s: float = STEP_TIMEOUT_S) -> None:
        if world_size < 1:
            raise ValueError(f"world_size={world_size} is not allowed; it must be an int >= 1")
        self.world_size = world_size
        self.step_timeout_s = step_timeout_s
        self._n = 0
        self._closed = False
        self._secret = secrets.token_hex(16)  # a key prefix nobody can guess: 128 random bits
        self._store = loopback_store(max(start_timeout_s, step_timeout_s))
        self.port = self._store.port
        common = {
            **os.environ,
            "WORLD_SIZE": str(world_size), "LOCAL_WORLD_SIZE": str(world_size), "GROUP_RANK": "0",
            "MASTER_ADDR": LOOPBACK, "MASTER_PORT": str(self.port),
            # The ranks' process group joins this store as clients instead of rank 0 hosting one on every interface.
            "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "0",
            "GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo",
            "OMP_NUM_THREADS": str(threads),
            CONTROL_ENV: f"{LOOPBACK}:{self.port}", SECRET_ENV: self._secret, LAUNCHER_ENV: str(os.getpid()),
        }
        self.logs: list[IO[bytes]] = []
        self.popens: list[subprocess.Popen[bytes]] = []
        self._finalizer = weakref.finalize(self, _finalize, self.popens, self.logs)
        for rank in range(world_size):
            # Each rank's output in a file with no name: nothing is left on disk whoever ends first.
            log = tempfile.TemporaryFile(prefix=f"pitfalls-rank{rank}-")
            self.logs.append(log)
            # A session of its own: a Ctrl-C meant for the benchmark process is not also delivered to the ranks,
            # which the group stops itself.
            self.popens.append(processes.start([sys.executable, *entry, *args], stdin=subprocess.DEVNULL, stdout=log,
                                               stderr=subprocess.STDOUT,
                                               env={**common, "RANK": str(rank), "LOCAL_RANK": str(rank)}))
        self._watchers = [threading.Thread(target=self._watch, args=(rank,), daemon=True) for rank in range(world_size)]
        for watcher in self._watchers:
            watcher.start()
        self._wait(start_timeout_s, "ready")

    # --- processes ------------------------------------------------------------------------------------------

    def _key(self, name: str) -> str:
        return f"{self._secret}/{name}"

    def _watch(self, rank: int) -> None:
        """Wake the waiting caller when a rank exits (with a connection of its own: the caller's is waiting)."""
        self.popens[rank].wait()
        if self._closed:
            return
        with contextlib.suppress(DistStoreError, RuntimeError):
            store = TCPStore(LOOPBACK, self.port, is_master=False, timeout=datetime.timedelta(seconds=30))
            n = self._n
            for key in (f"done/{n}", f"done/{n + 1}"):
                store.set(self._key(key), "a rank exited")

    def log_tail(self, rank: int) -> str:
        """The last lines a rank wrote; read with pread, which leaves the file offset the rank writes at alone."""
        log = self.logs[rank]
        if log.closed:
            return ""
        size = os.fstat(log.fileno()).st_size
        start = max(0, size - _LOG_TAIL_BYTES)
        text = os.pread(log.fileno(), size - start, start).decode("utf-8", errors="replace")
        return "\n".join(text.splitlines()[-_LOG_TAIL_LINES:])

    def _fail(self, message: str, ranks: Sequence[int]) -> None:
        exits = []
        for rank, popen in enumerate(self.popens):
            with contextlib.suppress(subprocess.TimeoutExpired):
                popen.wait(timeout=0.5)
            if popen.returncode is not None:
                exits.append(_describe_exit(rank, popen.pid, popen.returncode))
        outputs = [f"--- rank {r} output (last lines) ---\n{tail}" for r in ranks if (tail := self.log_tail(r))]
        account = "\n".join([message, *exits, *outputs]).strip()
        self.close(graceful=False)
        raise RankFailed(account)

    def _hung(self, missing: Sequence[int]) -> list[int]:
        """Ask every rank that did not answer to write its stack; returns those still running."""
        hung = [r for r in missing if self.popens[r].poll() is None]
        for rank in hung:
            self.popens[rank].send_signal(signal.SIGUSR1)  # Popen's own check: never once the rank is reaped
        time.sleep(STACK_GRACE_S)
        return hung

    def _wait(self, timeout_s: float, what: str) -> list[bytes]:
        """Every rank's reply to the current command; raise `RankFailed` (after stopping them) if any failed."""
        n = self._n
        results = [self._key(f"result/{n}/{rank}") for rank in range(self.world_size)]
        try:
            self._store.wait([self._key(f"done/{n}")], datetime.timedelta(seconds=timeout_s))
        except DistStoreError:
            missing = [r for r, key in enumerate(results) if not self._store.check([key])]
            hung = self._hung(missing)
            self._fail(f"rank(s) {missing} did not report {what} within {timeout_s:g} s; "
                       f"the stacks of {hung} are in their output", missing)
        if self._store.check([self._key("error")]):
            error = self._store.get(self._key("error")).decode("utf-8", errors="replace")
            self._fail(error, [])
        missing = [r for r, key in enumerate(results) if not self._store.check([key])]
        if missing:
            self._fail(f"rank(s) {missing} exited before reporting {what}", missing)
        # The keys stay: a few hundred bytes per command, and a delete would cost a round trip each (a reply sent
        # in parts is deleted once read).
        return [get_value(self._store, key) for key in results]

    # --- commands -------------------------------------------------------------------------------------------

    def run(self, command: str) -> list[bytes]:
        """Send one command to every rank and return each rank's reply, rank 0 first.

        Args:
            command: ``name`` or ``name argument``, a name of the ranks' command table.

        Raises:
            RankFailed: a rank raised, died or hung (its traceback, exit or stack is in the message); every rank
                has been stopped by then.
        """
        if self._closed:
            raise RankFailed("the rank group is closed")
        self._n += 1
        exited = [r for r, popen in enumerate(self.popens) if popen.poll() is not None]
        if exited:
            self._fail(f"rank(s) {exited} exited before command {command!r}", exited)
        self._store.set(self._key(f"cmd/{self._n}"), command)
        return self._wait(self.step_timeout_s, repr(command))

    def __enter__(self: G) -> G:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self, *, graceful: bool = True) -> None:
        """Stop every rank and wait for them; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if graceful and all(popen.poll() is None for popen in self.popens):
            self._n += 1
            self._store.set(self._key(f"cmd/{self._n}"), "stop")
            deadline = time.monotonic() + STOP_GRACE_S
            for popen in self.popens:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    popen.wait(timeout=max(0.0, deadline - time.monotonic()))
        self._finalizer()
        for watcher in self._watchers:
            watcher.join(timeout=STOP_GRACE_S)

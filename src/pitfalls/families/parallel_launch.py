"""Start a DDP step's ranks with ``torchrun`` once, then drive them one command at a time.

The benchmark process (asv's, the CLI's) calls a `RankGroup` once per step; the ranks stay alive between calls,
so what is timed is a step, not a process start. It talks to them through a ``TCPStore`` of its own (PyTorch's
key-value store, here only a control channel; the ranks' process group is torchrun's):

- command ``n``: the group sets ``cmd/n``; every rank waits for it, runs it, writes ``result/n/<rank>`` and adds 1
  to ``count/n``; the rank that brings the count to the world size sets ``done/n``. The group waits on that one
  key, so a step costs a few loopback round trips and no polling.
- a rank that raises writes its traceback under ``error`` and sets ``done/n`` at once; a watcher thread sets it
  too when torchrun exits. The group then stops everything and raises `RankFailed` with the rank's traceback (or
  torchrun's last lines when a rank died without one): a failure ends the run within seconds, never a hang.
- ``torchrun`` is started on 127.0.0.1 with a free port; a port taken in the meantime (EADDRINUSE) is retried on
  another.
- No process is left behind: `RankGroup.close` asks the ranks to stop, then terminates torchrun and every rank
  it knows of, then kills what is left. The group's process need not close it: when it dies its store goes with
  it, and the ranks, waiting on that store, exit (and torchrun after them).

The benchmark process never forks: torchrun is a fresh interpreter (``subprocess`` with exec), so no CUDA state
is inherited (the forkserver rule of the asv suite).
"""

from __future__ import annotations

import contextlib
import datetime
import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import weakref
from collections.abc import Iterator, Sequence
from typing import IO

import psutil
import torch
from torch.distributed import DistStoreError, TCPStore

from pitfalls.families.parallel_step import RankFigures, StepConfig
from pitfalls.probes.result import Unavailable

__all__ = ["RankFailed", "RankGroup", "free_port", "torchrun_command"]

RANK_MODULE = "pitfalls.families.parallel_rank"
# Seconds to wait for every rank to start (interpreter, torch, process group, model), and for one command.
START_TIMEOUT_S = 300.0
STEP_TIMEOUT_S = 600.0
# Seconds a stopping rank, then a terminated torchrun, gets before the next, harder, step.
STOP_GRACE_S = 10.0
PORT_ATTEMPTS = 5
_PORT_IN_USE = re.compile(r"EADDRINUSE|address already in use", re.IGNORECASE)
_LOG_TAIL_LINES = 60
_LOG_TAIL_BYTES = 64 * 1024


class RankFailed(RuntimeError):
    """A rank raised, died, or did not report in time; the message holds its error and traceback."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (another process may still take it first)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def torchrun_command(config: StepConfig, device_type: str, *, port: int, control: str, entry: Sequence[str],
                     threads: int) -> list[str]:
    """The torchrun command line of one single-node group: ``world_size`` ranks on 127.0.0.1:``port``.

    Args:
        config: the step every rank runs its share of.
        device_type: "cpu" (gloo) or "cuda" (nccl).
        port: torchrun's rendezvous port (its TCPStore, which the ranks' process group uses too).
        control: ``host:port`` of the group's control store.
        entry: what torchrun runs: ``("-m", module)`` or a script path.
        threads: intra-op threads per rank.
    """
    return [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes=1", "--node-rank=0", f"--nproc-per-node={config.world_size}",
        "--rdzv-backend=static", "--master-addr=127.0.0.1", f"--master-port={port}", "--max-restarts=0",
        *entry,
        "--control", control, "--device", device_type, "--threads", str(threads),
        "--world-size", str(config.world_size), "--batch", str(config.batch),
        "--image-size", str(config.image_size), "--seed", str(config.seed), "--lr", repr(config.lr),
        "--dtype", config.dtype,
    ]


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _stop_processes(process: subprocess.Popen[bytes], known: Sequence[int], grace_s: float) -> None:
    """Terminate torchrun and every rank (its descendants and the pids the ranks reported), then kill the rest."""
    targets = {p.pid: p for p in _descendants(process.pid)}
    for pid in known:
        with contextlib.suppress(psutil.NoSuchProcess):
            targets.setdefault(pid, psutil.Process(pid))
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)  # torchrun forwards it to its workers
    for target in targets.values():
        with contextlib.suppress(psutil.NoSuchProcess):
            target.terminate()
    _, alive = psutil.wait_procs(list(targets.values()), timeout=grace_s)
    for target in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            target.kill()
    psutil.wait_procs(alive, timeout=grace_s)
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _finalize(process: subprocess.Popen[bytes], known: list[int], log: IO[bytes]) -> None:
    """Stop what a group left running; runs at `RankGroup.close` or, if never called, when the group is
    collected or the interpreter exits."""
    if process.poll() is None or any(psutil.pid_exists(pid) for pid in known):
        _stop_processes(process, known, STOP_GRACE_S)
    log.close()


class RankGroup:
    """``world_size`` ranks of a DDP step, started by torchrun and kept alive; calling the group runs one step.

    Args:
        config: the step each rank runs its share of.
        device_type: "cpu" (gloo ranks) or "cuda" (nccl, rank r on cuda:r).
        threads: intra-op threads per rank.
        entry: what torchrun runs; the default is the family's rank module. Tests pass a script.
        ports: the rendezvous ports to try, in order; the default draws free ones.
        start_timeout_s: seconds for every rank to report ready.
        step_timeout_s: seconds for every rank to report one command.

    Raises:
        RankFailed: a rank failed while starting, or no free port was found in ``PORT_ATTEMPTS`` tries.
    """

    def __init__(self, config: StepConfig, device_type: str, *, threads: int = 1,
                 entry: Sequence[str] = ("-m", RANK_MODULE), ports: Iterator[int] | None = None,
                 start_timeout_s: float = START_TIMEOUT_S, step_timeout_s: float = STEP_TIMEOUT_S) -> None:
        if device_type not in ("cpu", "cuda"):
            raise ValueError(f"device_type={device_type!r} is not allowed; allowed: cpu, cuda")
        self.config = config
        self.world_size = config.world_size
        self.step_timeout_s = step_timeout_s
        self.ports_tried: list[int] = []
        self.rank_pids: list[int] = []
        self._n = 0
        self._closed = False
        self._store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                               timeout=datetime.timedelta(seconds=max(start_timeout_s, step_timeout_s)))
        ports = ports if ports is not None else iter(free_port, None)
        for attempt in range(PORT_ATTEMPTS):
            port = next(ports)
            self.ports_tried.append(port)
            self._start(port, attempt, config, device_type, threads, entry)
            try:
                ready = self._wait(start_timeout_s, "start")
            except RankFailed as failure:
                if _PORT_IN_USE.search(str(failure)):
                    self._closed = False  # everything of that attempt is stopped; try the next port
                    continue
                raise
            self.rank_pids[:] = [int(json.loads(r)["pid"]) for r in ready]
            return
        raise RankFailed(f"no free port for torchrun after {PORT_ATTEMPTS} tries: {self.ports_tried} were in use")

    # --- processes ------------------------------------------------------------------------------------------

    def _start(self, port: int, attempt: int, config: StepConfig, device_type: str, threads: int,
               entry: Sequence[str]) -> None:
        self._prefix = f"a{attempt}/"
        self._n = 0
        control = f"127.0.0.1:{self._store.port}"
        command = torchrun_command(config, device_type, port=port, control=control, entry=entry, threads=threads)
        command += ["--prefix", self._prefix, "--launcher-pid", str(os.getpid())]
        # Threads per rank are set by the rank; this also keeps torchrun from printing its OMP_NUM_THREADS notice.
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        # torchrun's and the ranks' output, in a file with no name: nothing is left on disk whoever ends first (an
        # asv benchmark process ends without closing anything).
        self.log = tempfile.TemporaryFile(prefix="pitfalls-torchrun-")
        # A session of its own: a Ctrl-C meant for the benchmark process is not also delivered to the ranks, which
        # the group stops itself.
        self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
                                        env=env, start_new_session=True)
        self._finalizer = weakref.finalize(self, _finalize, self.process, self.rank_pids, self.log)
        self._watcher = threading.Thread(target=self._watch, args=(self.process, self._prefix), daemon=True)
        self._watcher.start()

    def _watch(self, process: subprocess.Popen[bytes], prefix: str) -> None:
        """Wake the waiting caller when torchrun exits, whatever the ranks managed to report.

        It sets the key the caller waits on for the current command and the next (the caller may be between
        the two; it checks torchrun before each command anyway). With a connection of its own: the caller's is
        busy waiting.
        """
        process.wait()
        if self._closed:
            return
        store = TCPStore("127.0.0.1", self._store.port, is_master=False, timeout=datetime.timedelta(seconds=30))
        n = self._n
        for key in (f"{prefix}done/{n}", f"{prefix}done/{n + 1}"):
            store.set(key, "torchrun exited")

    def _log_tail(self) -> str:
        """The last lines torchrun and the ranks wrote. Read with pread, which leaves the file offset the writers
        share where it is."""
        if self.log.closed:
            return ""
        size = os.fstat(self.log.fileno()).st_size
        start = max(0, size - _LOG_TAIL_BYTES)
        text = os.pread(self.log.fileno(), size - start, start).decode("utf-8", errors="replace")
        return "\n".join(text.splitlines()[-_LOG_TAIL_LINES:])

    # --- commands -------------------------------------------------------------------------------------------

    def _key(self, name: str) -> str:
        return f"{self._prefix}{name}"

    def _wait(self, timeout_s: float, what: str) -> list[bytes]:
        """Wait for every rank's result of the current command; raise `RankFailed` (after closing) if any failed."""
        n = self._n
        try:
            self._store.wait([self._key(f"done/{n}")], datetime.timedelta(seconds=timeout_s))
        except DistStoreError:
            self._fail(f"the ranks did not report {what} within {timeout_s:g} s")
        if self._store.check([self._key("error")]):
            self._fail(self._store.get(self._key("error")).decode("utf-8", errors="replace"))
        results = [self._key(f"result/{n}/{rank}") for rank in range(self.world_size)]
        if not self._store.check(results):
            code = self.process.poll()
            self._fail(f"torchrun exited with code {code} before every rank reported {what}")
        # The keys stay: a few hundred bytes per step, and a delete would cost a round trip each.
        return [self._store.get(key) for key in results]

    def _fail(self, message: str) -> None:
        # torchrun notices a failed rank within its monitor interval, stops the others and prints which rank failed
        # first and how (exit code, signal): give it the moment to do so, for the message.
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=STOP_GRACE_S)
        tail = self._log_tail()
        self.close(graceful=False)
        raise RankFailed(f"{message}\n--- torchrun output (last lines) ---\n{tail}" if tail else message)

    def run(self, command: str) -> list[bytes]:
        """Send one command to every rank and return each rank's reply, rank 0 first.

        Args:
            command: "step", "measure", "communication", "state" or "stop".

        Raises:
            RankFailed: a rank raised or died (its traceback is in the message), or the ranks did not answer in
                ``step_timeout_s``; every process has been stopped by then.
        """
        if self._closed:
            raise RankFailed("the rank group is closed")
        self._n += 1
        if self.process.poll() is not None:
            self._fail(f"torchrun exited with code {self.process.returncode}")
        self._store.set(self._key(f"cmd/{self._n}"), command)
        return self._wait(self.step_timeout_s, repr(command))

    def __call__(self) -> torch.Tensor:
        """Run one training step on every rank; return rank 0's loss, a scalar tensor as a one-process step's."""
        return torch.tensor(float(json.loads(self.run("step")[0])["loss"]))

    def measure(self) -> list[RankFigures]:
        """One step in which every rank measures its time and peak memory."""
        return [RankFigures(**json.loads(reply)) for reply in self.run("measure")]

    def communication(self) -> float | Unavailable:
        """Seconds of one profiled step in which a rank's communication was in flight, averaged over the ranks."""
        seconds = [float(json.loads(reply)["seconds"]) for reply in self.run("communication")]
        return sum(seconds) / len(seconds)

    def state(self) -> dict[str, torch.Tensor]:
        """Rank 0's weights (DDP keeps every rank's identical)."""
        state: dict[str, torch.Tensor] = torch.load(io.BytesIO(self.run("state")[0]), weights_only=True)
        return state

    def close(self, *, graceful: bool = True) -> None:
        """Stop every rank and torchrun, and wait for them; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if graceful and self.process.poll() is None:
            self._n += 1
            self._store.set(self._key(f"cmd/{self._n}"), "stop")
            try:
                self.process.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                pass
        self._finalizer()
        self._watcher.join(timeout=STOP_GRACE_S)

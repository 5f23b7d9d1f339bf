"""The rank's side of a `launch.RankGroup`: set up once, then run the group's commands from a table until "stop".

Command ``n`` is the key ``<secret>/cmd/n``, whose value is ``name`` or ``name argument``; the rank runs
``commands[name](state, argument)``, writes the reply under ``<secret>/result/n/<rank>`` (in parts above
`control.PART_BYTES`) and adds 1 to
``<secret>/count/n``; the rank that brings the count to the world size sets ``<secret>/done/n``, the one key the
group waits on. A rank that raises writes its traceback under ``<secret>/error`` and sets ``done/n`` at once.

``SIGUSR1`` makes the rank write every thread's stack to its output (faulthandler): the group sends it to a rank
that does not answer in time, so a hang ends with the hung rank's stack.
"""

from __future__ import annotations

import contextlib
import datetime
import faulthandler
import json
import os
import signal
import socket
import sys
import traceback
from collections.abc import Callable, Mapping
from typing import TypeVar

import psutil
from torch.distributed import DistError, DistStoreError, TCPStore

from pitfalls.distributed.control import CONTROL_ENV, LAUNCHER_ENV, SECRET_ENV, set_value

__all__ = ["STOP", "Command", "serve"]

State = TypeVar("State")
Command = Callable[[State, str], bytes]
STOP = "stop"
# Seconds between checks, while idle, that the process driving the ranks still exists.
IDLE_CHECK_S = 60.0


class _Server:
    def __init__(self) -> None:
        # The group's control store, as a client, and the run's secret, from the environment.
        host, _, port = os.environ[CONTROL_ENV].rpartition(":")
        self.store = TCPStore(host, int(port), is_master=False, timeout=datetime.timedelta(seconds=IDLE_CHECK_S))
        self.secret = os.environ[SECRET_ENV]
        self.rank = int(os.environ["RANK"])
        self.world_size = int(os.environ["WORLD_SIZE"])
        launcher = os.environ.get(LAUNCHER_ENV)
        self.launcher = psutil.Process(int(launcher)) if launcher else None
        self.n = 0

    def key(self, name: str) -> str:
        return f"{self.secret}/{name}"

    def reply(self, value: bytes) -> None:
        set_value(self.store, self.key(f"result/{self.n}/{self.rank}"), value)
        if self.store.add(self.key(f"count/{self.n}"), 1) == self.world_size:
            self.store.set(self.key(f"done/{self.n}"), "ok")

    def command(self) -> str:
        key = self.key(f"cmd/{self.n}")
        while True:
            try:
                self.store.wait([key], datetime.timedelta(seconds=IDLE_CHECK_S))
                return self.store.get(key).decode()
            except DistStoreError:
                # Idle for a while: carry on only if the process driving the ranks is still the one that started us.
                if self.launcher is not None and not self.launcher.is_running():
                    raise SystemExit(f"rank {self.rank}: the launching process {self.launcher.pid} is gone") from None

    def report_error(self) -> None:
        message = f"rank {self.rank} ({socket.gethostname()}, pid {os.getpid()}) failed:\n{traceback.format_exc()}"
        # The store may be what failed; the error is raised again either way.
        with contextlib.suppress(DistError):
            self.store.compare_set(self.key("error"), "", message)
            self.store.set(self.key(f"done/{self.n}"), "error")


def serve(setup: Callable[[], State], commands: Mapping[str, Command[State]]) -> None:
    """Run this rank: ``setup()`` once, report ready, then each command of the group until "stop".

    Args:
        setup: builds the rank's state (joins the process group, builds the model...).
        commands: name -> ``command(state, argument) -> reply``.

    Raises:
        Whatever a command raised, after its traceback is written for the group; ValueError for an unknown command.
    """
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    server = _Server()
    try:
        state = setup()
        server.reply(json.dumps({"pid": os.getpid(), "host": socket.gethostname()}).encode())
        while True:
            server.n += 1
            name, _, argument = server.command().partition(" ")
            if name == STOP:
                return
            if name not in commands:
                raise ValueError(f"command {name!r} is not a command; allowed: {', '.join(commands)}, {STOP}")
            server.reply(commands[name](state, argument))
    except BaseException:
        server.report_error()
        raise

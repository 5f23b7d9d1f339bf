"""The doctor under torchrun: each rank runs the doctor on its own script, and the ranks meet on the launcher's store,
joined as a client under this run's keys (docs/doctor.md, "Under torchrun: every rank, one report").
"""

from __future__ import annotations

import datetime
import functools
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from pitfalls.distributed.control import get_value, set_value
from pitfalls.doctor.script import ScriptError

__all__ = ["GATHER_GRACE_S", "Ranks", "launched"]

# Seconds past its budget rank 0 waits for the last reports: a rank that was stopped writes its report then.
GATHER_GRACE_S = 60.0
# Seconds to reach the launcher's store (it runs already when the ranks start) and for each of its answers.
STORE_TIMEOUT_S = 30.0
_POLL_S = 0.005


def launched() -> bool:
    """Whether a launcher started this process (torchrun sets ``RANK`` and ``WORLD_SIZE`` in every rank)."""
    return "RANK" in os.environ or "WORLD_SIZE" in os.environ


@dataclass
class Ranks:
    """This rank, the world (the ranks), the launcher's store under this run's keys, and the `time.monotonic()` at
    which the budget is spent."""

    rank: int
    world: int
    store: Any
    deadline: float

    @classmethod
    def from_environ(cls, budget_s: float) -> Ranks | None:
        """The ranks of this run, or None where no launcher started this process.

        Raises:
            ScriptError: a launcher's variables without torchrun's agent store (one line, exit 2).
        """
        env = os.environ
        if not launched():
            return None
        try:
            rank, world, port = int(env["RANK"]), int(env["WORLD_SIZE"]), int(env["MASTER_PORT"])
            host = env["MASTER_ADDR"]
        except (KeyError, ValueError):
            found = ", ".join(f"{k}={env[k]}" for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k in env)
            raise ScriptError(f"started by a launcher ({found}) without torchrun's RANK, WORLD_SIZE, MASTER_ADDR and "
                              "MASTER_PORT; run it under torchrun, or as one process without them") from None
        if env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() != "true":
            raise ScriptError("started by a launcher whose agent hosts no store for its ranks "
                              "(TORCHELASTIC_USE_AGENT_STORE is not True): run it under torchrun")
        try:
            client = dist.TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=STORE_TIMEOUT_S))
        except (RuntimeError, dist.DistError) as error:
            raise ScriptError(f"torchrun's store at {host}:{port} cannot be reached "
                              f"({str(error).splitlines()[0]})") from None
        run = f"pitfalls-doctor/{env.get('TORCHELASTIC_RUN_ID', 'run')}/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
        return cls(rank, world, dist.PrefixStore(run, client), time.monotonic() + budget_s)

    # -- the script's process group -------------------------------------------------------------------------------

    def __enter__(self) -> Ranks:
        self._init = dist.init_process_group
        ranks = self

        @functools.wraps(self._init)
        def init_process_group(*args: Any, **kwargs: Any) -> Any:
            left = datetime.timedelta(seconds=max(ranks.deadline - time.monotonic(), 1.0))
            timeout = kwargs.get("timeout")
            kwargs["timeout"] = left if timeout is None else min(timeout, left)
            return ranks._init(*args, **kwargs)

        dist.init_process_group = init_process_group
        return self

    def __exit__(self, *exc_info: object) -> None:
        dist.init_process_group = self._init
        if dist.is_initialized():  # the script's group, left by a run that ended: its peers' collectives end too
            dist.destroy_process_group()

    # -- meeting the other ranks ----------------------------------------------------------------------------------

    def ended(self, how: str) -> None:
        """This rank's run ended before its steps were done: the others stop at their next barrier (the first rank
        to end is named)."""
        self.store.compare_set("ended", "", f"rank {self.rank} {how}")

    def _wait(self, done: Callable[[], bool]) -> str | None:
        while not done():
            if self.store.check(["ended"]):
                return self.store.get("ended").decode()
            if time.monotonic() >= self.deadline:
                return "the budget was spent waiting for the other ranks"
            time.sleep(_POLL_S)
        return None

    def barrier(self, name: str) -> str | None:
        """Wait until every rank is at ``name``; returns why not (a rank that ended, the budget) or None."""
        key = f"at/{name}"
        self.store.add(key, 1)
        return self._wait(lambda: self.store.add(key, 0) >= self.world)

    def send(self, report: dict[str, Any]) -> None:
        """This rank's report, for rank 0."""
        set_value(self.store, f"report/{self.rank}", json.dumps(report).encode())

    def first_to_end(self) -> str:
        """The rank whose run ended first before its steps were done, and how ("rank 1 the script raised after 4
        steps"); "" when none did."""
        return self.store.get("ended").decode() if self.store.check(["ended"]) else ""

    def gather(self) -> list[dict[str, Any] | None]:
        """Every rank's report, in rank order, as rank 0 receives them until the budget's end and a grace (None: a
        rank that sent none)."""
        found: list[dict[str, Any] | None] = []
        deadline = self.deadline + GATHER_GRACE_S
        for rank in range(self.world):
            key = f"report/{rank}"
            while not self.store.check([key]) and time.monotonic() < deadline:
                time.sleep(_POLL_S * 10)
            found.append(json.loads(get_value(self.store, key)) if self.store.check([key]) else None)
        return found

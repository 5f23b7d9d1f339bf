"""Other work on the machine while a timed row runs: the CPU other processes take, and a wait until they leave it.

Why a timed row waits for free cores (`on_free_cores`) and records the other work it ran beside
(`Conditions.note`): docs/methodology.md, "Other work beside a timed row". Other work is the machine's busy CPU
time (``/proc/stat``) less this process's and its waited-for children's (`os.times`): a child still alive counts
as other.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from pitfalls.result import Unavailable

__all__ = ["QUIET_CORES", "WAIT_S", "WINDOW_S", "Conditions", "OtherWork", "OtherWorkMeter", "allowed_other_work",
           "machine_busy_seconds", "on_free_cores", "wait_for_cores"]

T = TypeVar("T")

# Other work a machine with nothing else to do still shows: kernel threads, idle daemons (0.01-0.07 cores measured
# here at quiet times).
QUIET_CORES = 0.1
# The longest a row waits for free cores. Work left over from before (a test run's last processes, a compile pool)
# ends within it; work that goes on longer is the machine's, and the row then runs beside it and says so.
WAIT_S = 10.0
# How long other work is watched before each decision to start: short against a row, long against the 10 ms ticks
# of the CPU counters.
WINDOW_S = 0.5
_STAT = "/proc/stat"


def machine_busy_seconds(path: str = _STAT) -> float | Unavailable:
    """CPU seconds every processor has been busy since boot (user, nice, system, irq, softirq, steal), or why not.

    Args:
        path: the kernel's CPU counters.

    Returns:
        Seconds, or `Unavailable` where there is no such file (not Linux).
    """
    try:
        with open(path) as stat:
            fields = stat.readline().split()
    except OSError as error:
        return Unavailable(f"other processes' CPU cannot be read here: {path}: {error.strerror}")
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _own_seconds() -> float:
    spent = os.times()
    return spent.user + spent.system + spent.children_user + spent.children_system


@dataclass(frozen=True)
class OtherWork:
    """CPU that processes other than this one and its waited-for children used over a window.

    Attributes:
        cores: CPU seconds per second of the window (1.0 is one core kept busy).
        seconds: the window.
    """

    cores: float
    seconds: float


class OtherWorkMeter:
    """Measures `OtherWork` over the body of a ``with`` block; ``result`` holds it (or why it is unavailable).

    Args:
        busy: the machine's busy seconds (`machine_busy_seconds`); tests pass a fake.
        own: this process's and its waited-for children's CPU seconds.
        clock: wall seconds.
    """

    def __init__(self, busy: Callable[[], float | Unavailable] = machine_busy_seconds,
                 own: Callable[[], float] = _own_seconds, clock: Callable[[], float] = time.perf_counter) -> None:
        self.busy, self.own, self.clock = busy, own, clock
        self.result: OtherWork | Unavailable = Unavailable("not measured yet")

    def __enter__(self) -> OtherWorkMeter:
        self._start = (self.clock(), self.busy(), self.own())
        return self

    def __exit__(self, *exc: object) -> None:
        began, busy, own = self._start
        now, busy_now = self.clock(), self.busy()
        if isinstance(busy, Unavailable) or isinstance(busy_now, Unavailable):
            self.result = busy if isinstance(busy, Unavailable) else busy_now  # type: ignore[assignment]
            return
        seconds = max(now - began, 1e-9)
        # A child reaped inside the window brings its whole life's CPU into ``own`` at once: never below zero.
        self.result = OtherWork(max(0.0, (busy_now - busy) - (self.own() - own)) / seconds, seconds)


def allowed_other_work(needs: int, cores: int | None = None) -> float:
    """The other work a row that needs ``needs`` cores can run beside: the cores it leaves, plus `QUIET_CORES`."""
    machine = (os.cpu_count() or 1) if cores is None else cores
    return max(machine - needs, 0) + QUIET_CORES


def wait_for_cores(needs: int, *, timeout_s: float = WAIT_S, cores: int | None = None,
                   watch: Callable[[float], OtherWork | Unavailable] | None = None,
                   clock: Callable[[], float] = time.monotonic) -> tuple[float, OtherWork | Unavailable]:
    """Wait until other work leaves ``needs`` cores free, watching it `WINDOW_S` at a time, at most ``timeout_s``.

    Args:
        needs: cores the row needs free of other work (1: its own process; every core: it has workers).
        timeout_s: the longest wait; 0 looks once.
        cores: the machine's cores; None means ``os.cpu_count()``.
        watch: ``watch(seconds) -> OtherWork`` over that long; None means an `OtherWorkMeter` around a sleep.
        clock: monotonic seconds.

    Returns:
        (seconds waited, the last look); the look is `Unavailable` where other work cannot be read (no wait then).
    """
    allowed = allowed_other_work(needs, cores)
    look = watch or _watch
    began = clock()
    while True:
        seen = look(WINDOW_S)
        waited = clock() - began
        if isinstance(seen, Unavailable) or seen.cores <= allowed or waited >= timeout_s:
            return waited, seen


def _watch(seconds: float) -> OtherWork | Unavailable:
    with OtherWorkMeter() as meter:
        time.sleep(seconds)
    return meter.result


@dataclass(frozen=True)
class Conditions:
    """What a timed reading had of the machine.

    Attributes:
        needs: cores it needed free of other work.
        allowed: the other work it could run beside (`allowed_other_work`).
        waited_s: how long it waited for them before it started.
        before: the other work seen just before it started.
        during: the other work while it ran.
    """

    needs: int
    allowed: float
    waited_s: float
    before: OtherWork | Unavailable
    during: OtherWork | Unavailable

    @property
    def given(self) -> bool | None:
        """Whether other work left it the cores it needed while it ran; None where that cannot be read."""
        return None if isinstance(self.during, Unavailable) else self.during.cores <= self.allowed

    def note(self) -> str:
        """One clause for the row's detail: the other work it ran beside, and the wait."""
        if isinstance(self.during, Unavailable):
            return f"other work not measured ({self.during.reason})"
        said = f"other work {self.during.cores:.2f} cores"
        if not self.given:
            said += f", over the {self.allowed:.2f} that leave it {self.needs} free"
        if self.waited_s >= 2 * WINDOW_S:  # more than the one look every row takes
            said += f" (waited {self.waited_s:.1f} s for free cores)"
        return said


def on_free_cores(run: Callable[[], T], needs: int) -> tuple[T, Conditions]:
    """Run a timed reading once other work leaves it ``needs`` cores (`wait_for_cores`), and measure that work.

    Args:
        run: the reading.
        needs: cores it needs free of other work.

    Returns:
        What ``run`` returned, and the `Conditions` it ran in.
    """
    waited, before = wait_for_cores(needs, timeout_s=WAIT_S)  # read now: a test may set it
    with OtherWorkMeter() as meter:
        value = run()
    return value, Conditions(needs, allowed_other_work(needs), waited, before, meter.result)

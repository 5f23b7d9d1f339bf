"""The budgeted run's schedule: pieces in a fixed priority order, each started only when its cost fits the time left.

docs/gpu.md says what happens to a piece that does not fit or outruns the budget. The clock and the launcher are
arguments, so the schedule can be tested with a fake clock and planted costs.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pitfalls import processes

__all__ = ["DONE", "FAILED", "GRACE_S", "MARGIN_S", "NOT_SELECTED", "OVER_BUDGET", "STOPPED", "Entry", "Piece",
           "launch", "schedule"]

# Seconds a piece may run past the budget before it is stopped: a piece whose cost was read low still gets to
# finish a result it is writing, and the run as a whole ends within budget + margin + grace.
MARGIN_S = 15.0
# Seconds between SIGTERM and SIGKILL of a stopped piece's process group.
GRACE_S = 5.0

DONE, FAILED, OVER_BUDGET, STOPPED, NOT_SELECTED = "done", "failed", "over budget", "stopped by the budget", \
    "not selected"


@dataclass(frozen=True)
class Piece:
    """One piece of the run.

    Attributes:
        name: its key in the cost file, in ``figures.json`` and in ``--only``.
        group: its priority group (1 first).
        title: what it measures, for the report.
        guess_s: seconds assumed by device type ("cuda", "cpu") while no run has recorded its cost: stated, and
            on the high side, so that a first run leaves a piece out rather than stop it half-way.
        command: the command line of a planted piece (tests); empty for the suite's own pieces, which run as
            ``python -m pitfalls.gpu_run piece NAME``.
    """

    name: str
    group: int
    title: str
    guess_s: Mapping[str, float]
    command: tuple[str, ...] = ()


@dataclass(frozen=True)
class Entry:
    """What the schedule did with one piece.

    Attributes:
        name: the piece.
        group: its priority group.
        status: `DONE`, `FAILED`, `OVER_BUDGET`, `STOPPED` or `NOT_SELECTED`.
        cost_s: the seconds it was expected to take.
        cost_from: where that came from ("recorded on KIND" or "guess").
        left_s: seconds of the budget left when it was considered.
        seconds: seconds it ran (0 when it did not start).
        exit_code: its process's exit status (None when it did not start or was stopped).
        reason: why it did not run, or how it ended when not done.
    """

    name: str
    group: int
    status: str
    cost_s: float
    cost_from: str
    left_s: float
    seconds: float = 0.0
    exit_code: int | None = None
    reason: str = ""

    @property
    def started(self) -> bool:
        return self.status in (DONE, FAILED, STOPPED)

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "started": self.started}


# launch(piece, timeout_s) -> (exit code, stopped by the timeout)
Launcher = Callable[[Piece, float], tuple[int | None, bool]]


def schedule(pieces: Sequence[Piece], *, budget_s: float, cost: Callable[[Piece], tuple[float, str]],
             launch: Launcher, clock: Callable[[], float], on_entry: Callable[[Entry], None] = lambda _: None,
             selected: Callable[[Piece], bool] = lambda _: True, margin_s: float = MARGIN_S) -> list[Entry]:
    """Run the pieces in order, each only when its cost fits the budget's time left.

    Args:
        pieces: in priority order.
        budget_s: seconds for the whole run.
        cost: a piece's expected seconds and where the figure came from.
        launch: runs a piece with a time limit; returns its exit status and whether the limit stopped it.
        clock: seconds, monotonic.
        on_entry: called after each piece (the run writes its files there, so a stop keeps what is done).
        selected: pieces not selected are listed as such and not run.
        margin_s: seconds a piece may run past the budget before it is stopped.

    Returns:
        One `Entry` per piece, in order.
    """
    began = clock()
    entries = []
    for piece in pieces:
        left = budget_s - (clock() - began)
        expected, source = cost(piece)
        if not selected(piece):
            entry = Entry(piece.name, piece.group, NOT_SELECTED, expected, source, left)
        elif expected > left:
            entry = Entry(piece.name, piece.group, OVER_BUDGET, expected, source, left,
                          reason=f"over budget: needs about {expected:.0f} s, {max(left, 0.0):.0f} s left")
        else:
            started = clock()
            code, stopped = launch(piece, left + margin_s)
            took = clock() - started
            if stopped:
                entry = Entry(piece.name, piece.group, STOPPED, expected, source, left, took, None,
                              f"stopped {margin_s:.0f} s past the budget, after {took:.0f} s")
            else:
                status = DONE if code == 0 else FAILED
                entry = Entry(piece.name, piece.group, status, expected, source, left, took, code,
                              "" if code == 0 else f"exit {code}")
        entries.append(entry)
        on_entry(entry)
    return entries


def launch(command: Sequence[str], timeout_s: float, log: Path,
           env: Mapping[str, str] | None = None) -> tuple[int | None, bool]:
    """Run ``command`` in a session of its own, its output appended to ``log``, stopped at ``timeout_s``.

    Returns:
        (its exit status, False), or (None, True) when the time limit stopped it and every process it started.
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as sink:
        try:
            return processes.run(command, timeout_s=timeout_s, grace_s=GRACE_S, env=env, stdout=sink,
                                 stderr=subprocess.STDOUT).returncode, False
        except subprocess.TimeoutExpired:
            return None, True

"""The asv grids' names, the two variables that choose one (``PITFALLS_GRID``, ``PITFALLS_ROUNDS``), and the one
that names a run's file of compile crashes (``PITFALLS_COMPILE_FAILURES``, read by `pitfalls.measure.case`).

The grids' sizes live with the suite (benchmarks/common.py). Their names and the reading of the two variables live
here, in a module that imports nothing heavy, so that the main job and the comparison refuse a bad value with one
line before asv starts: asv's import of the suite would otherwise fail on it with a traceback.
"""

from __future__ import annotations

from collections.abc import Mapping

GRID_ENV = "PITFALLS_GRID"
ROUNDS_ENV = "PITFALLS_ROUNDS"
GRID_NAMES = ("quick", "full")
DEFAULT_GRID = "quick"
# A file shared by one run's processes (asv forks one per benchmark and parameter set, and a case is built in each):
# a case whose compile crashed is compiled once per run, not once per figure, each later process skipping it with
# the same reason. The main job names a file of its own run here; unset, each process compiles for itself.
COMPILE_FAILURES_ENV = "PITFALLS_COMPILE_FAILURES"


def chosen_grid(environ: Mapping[str, str]) -> tuple[str, int | None]:
    """The grid ``PITFALLS_GRID`` names (``quick`` when unset) and the rounds ``PITFALLS_ROUNDS`` asks for.

    Args:
        environ: the environment to read (``os.environ`` in a run).

    Returns:
        ``(grid name, rounds)``; rounds is None when ``PITFALLS_ROUNDS`` is unset (the grid's own count).

    Raises:
        ValueError: a value that is not allowed, named with what is.
    """
    name = environ.get(GRID_ENV, DEFAULT_GRID)
    if name not in GRID_NAMES:
        raise ValueError(f"{GRID_ENV}={name!r} is not a grid; allowed: {', '.join(GRID_NAMES)}")
    rounds = environ.get(ROUNDS_ENV)
    if rounds is None:
        return name, None
    if not rounds.isdigit() or int(rounds) < 1:
        raise ValueError(f"{ROUNDS_ENV}={rounds!r} is not a number of rounds; allowed: an integer >= 1")
    return name, int(rounds)

"""The report's unit of data: one figure of one benchmark case (`Row`), and the few facts every part asks of rows.

asv stores a benchmark that was skipped (NotImplementedError in setup, SkipNotImplemented in the method) as NaN and
one that failed as null; both become ``value=None`` here, told apart by ``status``.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FAILED", "FLOOR", "OK", "SKIPPED", "Row", "baseline_variant", "checked_rows", "env_label", "group",
           "recency"]

OK, SKIPPED, FAILED = "ok", "skipped", "failed"
# The reference case of a family: the last value of its benchmarks' `variant` axis, the best the hardware can do
# for the family's job. The report shows it like a variant and divides every variant's time by it.
FLOOR = "floor"
_OLDEST = dt.datetime.min.replace(tzinfo=dt.timezone.utc)


@dataclass(frozen=True)
class Row:
    """One figure of one benchmark case, as asv recorded it.

    Attributes:
        machine: asv machine name (the folder under the results directory).
        commit: full commit hash the figure was measured at.
        commit_date: when that commit was made (UTC), as asv records it.
        measured_at: when asv started this benchmark (UTC); None if the results file does not say.
        env: asv environment name (one per torch version in a matrix run).
        torch: torch version of the environment, or None when nothing asv recorded names it.
        torch_from: where ``torch`` was read ("asv params", "asv requirements", "environment name"); None with it.
        family: benchmark module without its ``bench_`` prefix ("loss", "sampler").
        benchmark: full asv benchmark name, e.g. "bench_loss.Step.time_step".
        kind: "time", "peakmem", "mem" or "track" (asv's benchmark types).
        unit: the benchmark's unit ("seconds", "bytes", or a track_'s own unit such as "x").
        params: parameter name -> value for this case, in the benchmark's order.
        value: the figure, or None when the case was skipped or failed.
        status: "ok", "skipped" or "failed".
        machine_facts: asv's machine.json for the machine (cpu, num_cpu, arch, os, ram).
        in_suite: False for a benchmark that benchmarks.json does not describe, or whose parameters are not the
            ones it describes (their names are then asv's defaults param1, param2...); the report lists those under
            "other benchmarks".
    """

    machine: str
    commit: str
    commit_date: dt.datetime | None
    measured_at: dt.datetime | None
    env: str
    torch: str | None
    family: str
    benchmark: str
    kind: str
    unit: str
    params: dict[str, Any] = field(hash=False)
    value: float | None
    status: str
    machine_facts: dict[str, Any] = field(default_factory=dict, hash=False, compare=False, repr=False)
    torch_from: str | None = None
    in_suite: bool = True

    @property
    def figure(self) -> str:
        """The method name, e.g. "time_step" or "track_speedup"."""
        return self.benchmark.rsplit(".", 1)[-1]

    @property
    def figure_key(self) -> str:
        """What the summary groups columns by: the kind for time_/peakmem_, the method name for track_."""
        return self.figure if self.kind == "track" else self.kind

    @property
    def case(self) -> tuple[tuple[str, Any], ...]:
        """The parameters as a hashable tuple of (name, value)."""
        return tuple(self.params.items())

    @property
    def measured(self) -> bool:
        """True when the row holds a number (neither skipped nor failed)."""
        return self.status == OK and self.value is not None


def recency(row: Row) -> tuple[dt.datetime, dt.datetime]:
    """How recent a row's figure is: by its commit's date, then by when asv measured it (unknown: oldest)."""
    return row.commit_date or _OLDEST, row.measured_at or _OLDEST


def env_label(row: Row) -> str:
    """How a row's environment is named in headings: its torch version when known, else asv's env name."""
    return f"torch {row.torch}" if row.torch else f"env {row.env}"


def baseline_variant(rows: Iterable[Row]) -> str:
    """The family's reference variant: the first ``variant`` value in asv's parameter order ("naive")."""
    for row in rows:
        if "variant" in row.params:
            return str(row.params["variant"])
    return "baseline"


def group(rows: Iterable[Row], key: Callable[[Row], Any]) -> dict[Any, list[Row]]:
    """Rows grouped by ``key``, groups and rows in first-seen order."""
    grouped: dict[Any, list[Row]] = defaultdict(list)
    for row in rows:
        grouped[key(row)].append(row)
    return grouped


def checked_rows(rows: Any) -> list[Row]:
    """``rows`` as a list, or a TypeError/ValueError saying what it is instead of a non-empty sequence of Row."""
    if isinstance(rows, (str, bytes)) or not isinstance(rows, Iterable):
        raise TypeError(f"rows must be a sequence of Row (from read_results), got {type(rows).__name__}")
    rows = list(rows)
    bad = [r for r in rows if not isinstance(r, Row)]
    if bad:
        raise TypeError(f"rows must hold Row objects (from read_results), got {type(bad[0]).__name__}")
    if not rows:
        raise ValueError("rows is empty: nothing to report (read_results found no figures)")
    return rows

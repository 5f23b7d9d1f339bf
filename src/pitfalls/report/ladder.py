"""The loader's ladder from one committed results file: each rung's figures without and with workers, one line.

The loader's documentation page holds this module's output for a file of ``results/`` (generated, and a test
compares the two), so the table is the results and nothing typed by hand: ``python -m pitfalls.report.ladder
FILE`` prints it.
A rung and cache whose every figure is n/a on that machine (the RAM rungs read no file cold, `gpu_decode` needs
CUDA) is named under the table instead of being a line of n/a.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pitfalls.markdown import table
from pitfalls.report.loading import file_rows
from pitfalls.report.rows import Row

__all__ = ["COLUMNS", "Column", "ladder_lines", "ladder_of", "main"]

# The case axes a line is told apart by; the workers are a line's columns; the device is the results' CPU.
_WORKERS = "num_workers"
_PLANTED_STEP = "model_ms"


@dataclass(frozen=True)
class Column:
    """One figure of the ladder.

    Attributes:
        heading: the column's heading, before the workers it shows.
        benchmark: the asv benchmark the figure is read from.
        digits: decimals shown.
        over_naive: show the figure divided by `naive`'s at the same cache and workers.
    """

    heading: str
    benchmark: str
    digits: int
    over_naive: bool = False


COLUMNS: tuple[Column, ...] = (
    Column("samples/s", "bench_loader.Throughput.track_samples_per_second", 0),
    Column("speedup over naive", "bench_loader.Speedup.track_speedup", 2),
    Column("samples/s over naive's", "bench_loader.Throughput.track_samples_per_second", 2, over_naive=True),
    Column("wait share in `next()`", "bench_loader.Verdict.track_wait_share", 2),
    Column("starves a step below (ms)", "bench_loader.Verdict.track_starves_below", 1),
)


def _value(row: Row | None) -> float | None:
    return row.value if row is not None and row.measured else None


def _cell(values: Sequence[float | None], digits: int) -> str:
    return " / ".join("n/a" if v is None else f"{v:,.{digits}f}" for v in values)


def ladder_lines(rows: Sequence[Row]) -> list[str]:
    """The ladder table (markdown lines) of the loader's rows of one run, then the lines left out.

    Args:
        rows: one run's rows (`pitfalls.report.loading.file_rows`), of which its CPU cases are read; the verdict's
            figures are read at no planted step (``model_ms`` 0).

    Returns:
        The heading, the separator, one line per rung and cache (asv's order), and a sentence naming the rungs with
        no figure; an empty list when the rows hold no loader figures.
    """
    figures: dict[tuple[str, tuple[tuple[str, Any], ...]], Row] = {}
    lines: dict[tuple[tuple[str, Any], ...], None] = {}
    workers: dict[int, None] = {}
    wanted = {column.benchmark for column in COLUMNS}
    for row in rows:
        if row.benchmark not in wanted or row.params.get(_PLANTED_STEP, 0) != 0 or row.params.get("device") != "cpu":
            continue
        params = {k: v for k, v in row.params.items() if k != _PLANTED_STEP}
        workers[int(params.pop(_WORKERS))] = None
        line = tuple(params.items())
        lines[line] = None
        figures[row.benchmark, (*line, (_WORKERS, row.params[_WORKERS]))] = row
    if not lines:
        return []
    counts = sorted(workers)
    varying = [name for name in dict(next(iter(lines))) if name not in ("variant", "device")
               and len({dict(line)[name] for line in lines}) > 1]
    shown_workers = " / ".join(map(str, counts))
    header = ["rung", *varying, *(f"{c.heading}, {shown_workers} workers" if i == 0 else f"{c.heading}, {shown_workers}"
                                  for i, c in enumerate(COLUMNS))]
    body: list[list[str]] = []
    empty: list[str] = []

    def values(column: Column, line: tuple[tuple[str, Any], ...]) -> list[float | None]:
        got = [_value(figures.get((column.benchmark, (*line, (_WORKERS, w))))) for w in counts]
        if not column.over_naive:
            return got
        naive = tuple(("variant", "naive") if k == "variant" else (k, v) for k, v in line)
        base = [_value(figures.get((column.benchmark, (*naive, (_WORKERS, w))))) for w in counts]
        return [None if v is None or b is None or b == 0 else v / b for v, b in zip(got, base, strict=True)]

    for line in lines:
        named = dict(line)
        cells = [values(column, line) for column in COLUMNS]
        label = ", ".join(f"{name}={named[name]}" for name in varying)
        if all(v is None for cell in cells for v in cell):
            empty.append(f"`{named['variant']}`" + (f" ({label})" if label else ""))
            continue
        body.append([f"`{named['variant']}`", *(str(named[name]) for name in varying),
                     *(_cell(cell, c.digits) for cell, c in zip(cells, COLUMNS, strict=True))])
    shown = table(header, body)
    if empty:
        shown += ["", "No figure on this machine (n/a in every column): " + ", ".join(empty) + "."]
    return shown


def ladder_of(results_file: Path) -> list[str]:
    """The ladder table of one results file.

    Raises:
        ValueError: the file is not a results file or holds no loader figures.
    """
    lines = ladder_lines(file_rows(results_file))
    if not lines:
        raise ValueError(f"{str(results_file)!r} holds no loader figures")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """Print the ladder of one results file; exit 2 with one line on a path that is not one."""
    parser = argparse.ArgumentParser(prog="python -m pitfalls.report.ladder", description=__doc__)
    parser.add_argument("results_file", type=Path, help="results/<machine>/<commit>-<env>.json")
    args = parser.parse_args(argv)
    try:
        lines = ladder_of(args.results_file)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

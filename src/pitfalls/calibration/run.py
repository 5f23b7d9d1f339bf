"""Run the calibration table: the shared checks, the group-memory checks, the doctor's and every family's own rows."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from pitfalls.calibration.figure_checks import shared_checks
from pitfalls.calibration.group_memory_checks import group_memory_checks
from pitfalls.doctor.checks import doctor_checks
from pitfalls.known.table import CPU, CUDA, Check, Reading, Row, verdict
from pitfalls.registry import all_families
from pitfalls.result import Unavailable

__all__ = ["all_checks", "register", "render", "run_checks"]


def all_checks() -> tuple[Check, ...]:
    """Every check: the shared ones, the process-group ones, the doctor's, then each registered family's
    ``calibrations``."""
    families = (check for entry in all_families().values() for check in entry.calibrations)
    return (*shared_checks(), *group_memory_checks(), *doctor_checks(), *families)


def run_checks(checks: Sequence[Check], device: str) -> list[Row]:
    """Run each check and judge it; a CUDA check reads "not run here" unless ``device`` is cuda and one exists.

    Args:
        checks: the checks, in table order.
        device: "cpu" (CPU checks only run) or "cuda" (CPU and CUDA checks run).

    Returns:
        One `Row` per check.
    """
    rows = []
    for check in checks:
        if check.device == CUDA and (device != CUDA or not torch.cuda.is_available()):
            why = "no CUDA device" if not torch.cuda.is_available() else "--device cpu"
            rows.append(verdict(check, Reading(planted=float("nan"), measured=Unavailable(f"not run here: {why}"))))
            continue
        # Each check on its own device: a CPU check's known answer and tolerance are the CPU's (its planted
        # workers, its gloo ranks), whatever device the table was asked for.
        rows.append(verdict(check, check.measure(check.device)))
    return rows


def _number(value: float | None) -> str:
    if value is None or value != value:
        return "-"
    return f"{value:.4g}"


def render(rows: Sequence[Row], console: Console, title: str = "calibration") -> None:
    """Print the table: one row per check (planted, measured, error, tolerance, verdict, how it was read)."""
    table = Table(title=title)
    for column in ("check", "unit", "planted", "measured", "error", "tolerance", "verdict", "detail"):
        table.add_column(column, overflow="fold")
    for row in rows:
        error = "-" if row.error is None else (_number(row.error) if row.absolute else f"{row.error:.1%}")
        tolerance = ("exact" if row.tolerance == 0 else
                     _number(row.tolerance) if row.absolute else f"{row.tolerance:.0%}")
        color = {"pass": "green", "fail": "red"}.get(row.verdict, "yellow")
        table.add_row(row.check, row.unit, _number(row.planted), _number(row.measured), error, tolerance,
                      f"[{color}]{row.verdict}", row.reason)
    console.print(table)


def cmd_calibrate(args: argparse.Namespace, console: Console) -> int:
    checks = all_checks()
    names = [c.name for c in checks]
    if args.only:
        unknown = [n for n in args.only if n not in names]
        if unknown:
            args.parser.error(f"--only {unknown[0]!r} is not a check; allowed: {', '.join(names)}")
        checks = tuple(c for c in checks if c.name in args.only)
    rows = run_checks(checks, args.device)
    if args.json:
        # The NaN planted value of a row not run is null.
        print(json.dumps([{**asdict(row), "instruments": list(row.instruments),
                           "planted": None if row.planted != row.planted else row.planted} for row in rows], indent=1))
    else:
        render(rows, console)
    return 1 if any(r.verdict == "fail" for r in rows) else 0


def register(commands: Any) -> None:
    """Add ``pitfalls calibrate [--device cpu|cuda] [--json] [--only NAME]`` to the command line."""
    parser = commands.add_parser("calibrate", help="run known-answer workloads through every instrument")
    parser.add_argument("--device", choices=(CPU, CUDA), default=CUDA if torch.cuda.is_available() else CPU,
                        help="cpu: CPU checks only; cuda: CPU and CUDA checks (default: cuda when present)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--only", action="append", metavar="NAME", help="run only this check (repeatable)")
    parser.set_defaults(run=cmd_calibrate, parser=parser)

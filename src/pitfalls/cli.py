"""The ``pitfalls`` command: list the variants, check them against naive, probe one case."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from pitfalls.devices import available_devices
from pitfalls.equivalence import check_all
from pitfalls.registry import FAMILIES


def cmd_list(args: argparse.Namespace, console: Console) -> int:
    table = Table(title="pitfall families")
    for column in ("family", "article", "variants (naive first)", "what it shows"):
        table.add_column(column)
    for family in FAMILIES.values():
        table.add_row(family.name, family.article, ", ".join(family.variants), family.summary)
    console.print(table)
    return 0


def cmd_check(args: argparse.Namespace, console: Console) -> int:
    devices = tuple(args.device) if args.device else available_devices()
    missing = [device for device in devices if device not in available_devices()]
    if missing:
        console.print(f"[red]device {', '.join(missing)} is not available here; available: {', '.join(available_devices())}")
        return 2
    rows = check_all(devices)
    table = Table(title=f"every variant against its family's naive variant ({', '.join(devices)})")
    for column in ("family", "variant", "device", "matches naive", "max abs difference", "failed on"):
        table.add_column(column)
    for row in rows:
        verdict = "[green]yes[/green]" if row.matches else "[red]NO[/red]"
        table.add_row(row.family, row.variant, row.device, verdict, f"{row.max_abs_diff:.3g}", row.detail)
    console.print(table)
    failed = [f"{r.family}/{r.variant} on {r.device}" for r in rows if not r.matches]
    if failed:
        console.print(f"[red]{len(failed)} variant(s) differ from naive:[/red] {', '.join(failed)}")
        return 1
    console.print(f"all {len(rows)} variant runs match naive")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pitfalls", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="list the families and their variants").set_defaults(run=cmd_list)
    check = commands.add_parser("check", help="run every variant on small inputs and compare it with naive")
    check.add_argument(
        "--device", action="append", choices=("cpu", "cuda"), help="device to check on (repeatable; default: all)"
    )
    check.set_defaults(run=cmd_check)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    args = build_parser().parse_args(argv)
    return args.run(args, Console())


if __name__ == "__main__":
    sys.exit(main())

"""The ``pitfalls`` command: list the families, check every variant against naive, probe one case, report."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from pitfalls.calibration.marks import uncalibrated
from pitfalls.calibration.run import all_checks
from pitfalls.calibration.run import register as register_calibrate
from pitfalls.devices import available_devices
from pitfalls.doctor.cli import register as register_doctor
from pitfalls.equivalence import check_all
from pitfalls.family import COMPILE, CUDA, FLOOR, HAZARDS, SkipCase
from pitfalls.probes import (
    ProbeFigure,
    Unavailable,
    compile_failure_reason,
    count_cuda_syncs,
    count_hazards,
    probe_case,
    render,
)
from pitfalls.registry import all_families, family, load_errors
from pitfalls.runner import merge
from pitfalls.scan import register as register_scan
from pitfalls.scan_loader.cli import register as register_scan_loader


def cmd_list(_args: argparse.Namespace, console: Console) -> int:
    table = Table(title="pitfall families")
    for column in ("family", "article", "variants (naive first)", "floor", "parameters (default)", "what it shows"):
        table.add_column(column, overflow="fold")
    for entry in all_families().values():
        params = ", ".join(f"{p.name}={'auto' if p.default is None else p.default}" for p in entry.params)
        table.add_row(entry.name, entry.article, ", ".join(entry.variants), FLOOR if entry.floor else "-", params,
                      entry.summary)
    console.print(table)
    for error in load_errors():
        console.print(f"[red]left out: {error}")
    return 0


def cmd_check(args: argparse.Namespace, console: Console) -> int:
    devices = tuple(args.device) if args.device else available_devices()
    missing = [device for device in devices if device not in available_devices()]
    if missing:
        available = ", ".join(available_devices())
        console.print(f"[red]device {', '.join(missing)} is not available here; available: {available}")
        return 2
    rows = check_all(devices, tuple(args.family) if args.family else None)
    table = Table("family", "variant", "device", "matches naive", "max abs diff", "sync hazards", "syncs", "detail",
                  title=f"every variant against its family's naive variant ({', '.join(devices)})")
    notes = set()
    for row in rows:
        if row.skipped:
            table.add_row(row.family, row.variant, row.device, "n/a", "n/a", "n/a", "n/a",
                          f"not run here: {row.skipped}")
            continue
        verdict = "[green]yes[/green]" if row.matches else "[red]NO[/red]"
        hazards, syncs = sync_columns(row.family, row.variant, row.device)
        if syncs.startswith("n/a: "):
            notes.add(f"syncs n/a on {row.device}: {syncs.removeprefix('n/a: ')}")
            syncs = "n/a"
        table.add_row(
            row.family, row.variant, row.device, verdict, f"{row.max_abs_diff:.3g}", hazards, syncs, row.detail
        )
    console.print(table)
    console.print("sync hazards: ops per call that make the host wait for an accelerator (counted on any device)")
    for note in sorted(notes):
        console.print(note)
    failed = [f"{r.family}/{r.variant} on {r.device}" for r in rows if not r.matches and not r.skipped]
    skipped = [f"{r.family}/{r.variant} on {r.device}" for r in rows if r.skipped]
    if failed:
        console.print(f"[red]{len(failed)} variant(s) differ from naive:[/red] {', '.join(failed)}")
        return 1
    ran = len(rows) - len(skipped)
    console.print(f"all {ran} variant runs match naive"
                  + (f"; {len(skipped)} not run here: {', '.join(skipped)}" if skipped else ""))
    return 0


def sync_columns(family_name: str, variant: str, device: str) -> tuple[str, str]:
    """Sync hazards (any device) and real syncs (CUDA) of one call of a smoke-size case, as table cells."""
    entry = family(family_name)
    if HAZARDS not in entry.figures and CUDA not in entry.figures:
        return "n/a", f"n/a: does not apply to the {family_name} family"
    try:
        case = entry.build(variant, device=device, **entry.smoke)
    except SkipCase as skip:
        return "n/a", f"n/a: {skip.reason}"
    with case:
        case()  # warm-up: one-off work (allocator, lazy init) is not the variant's cost
        hazards = str(count_hazards(case).total) if HAZARDS in entry.figures else "n/a"
        syncs = count_cuda_syncs(case, calls=3, warmup=0)
    return hazards, (f"n/a: {syncs.reason}" if isinstance(syncs, Unavailable) else f"{syncs.per_call:g}")


def probe_params(args: argparse.Namespace) -> dict[str, Any]:
    """The family parameters given on the command line (flags and ``--param NAME=VALUE``), parsed and checked.

    Raises:
        ValueError, TypeError: a parameter the family lacks or a value it does not allow (`main` prints the line).
    """
    entry = family(args.family)
    given: dict[str, str] = {}
    for item in args.param or ():
        name, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--param {item!r} is not NAME=VALUE")
        given[name.strip().replace("-", "_")] = value
    for param in entry.params:
        text = getattr(args, f"param_{param.name}", None)
        if text is not None:
            given[param.name] = text
    return {name: entry.param(name).parse(text) for name, text in given.items()}


def cmd_probe(args: argparse.Namespace, console: Console) -> int:
    entry = family(args.family)
    entry.check_case(args.variant)
    params = probe_params(args)
    compiled = bool(getattr(args, "compiled", False))
    try:
        # Closed on the way out: a case may hold worker processes or ranks.
        with contextlib.ExitStack() as held:
            case = held.enter_context(entry.build(args.variant, device=args.device, compiled=compiled, **params))
            naive = held.enter_context(
                entry.build(entry.baseline, device=args.device, compiled=compiled, **case.params)
            )
            figures = probe_case(case, baseline_case=naive, applies=entry.figures, trace_path=args.trace,
                                 rounds=args.rounds)
            if entry.own_figures is not None:
                figures += [ProbeFigure(*figure) for figure in entry.own_figures(case)]
    except SkipCase as skip:
        print(f"unavailable: {args.family}/{args.variant} cannot run here: {skip.reason}", file=sys.stderr)
        return 2
    except torch._dynamo.exc.BackendCompilerFailed as error:
        # As the asv suite records it: the figure cannot be measured with this torch, and why.
        print(f"unavailable: {compile_failure_reason(error)}", file=sys.stderr)
        return 2
    console.print(render(figures, title=case.name))
    marked = uncalibrated(args.family, [f.name for f in figures], all_checks())
    if marked:
        console.print(f"uncalibrated (no check of `pitfalls calibrate` reads them): {', '.join(marked)}")
    if args.trace:
        console.print(f"trace written to {args.trace} (open in chrome://tracing or https://ui.perfetto.dev)")
    return 0


def cmd_report(args: argparse.Namespace, console: Console) -> int:
    from pitfalls.report import write_report  # matplotlib loads only for this command

    try:
        path = write_report(args.results, args.out, machine=args.machine, commit=args.commit)
    except ValueError as error:
        console.print(f"[red]{error}")
        return 2
    console.print(f"report written to {path}")
    return 0


def add_probe_parser(commands: Any) -> None:
    """``pitfalls probe FAMILY VARIANT [options]``: one subcommand per family, its flags from its parameters."""
    probe = commands.add_parser("probe", help="run one case and print every probe's figures")
    per_family = probe.add_subparsers(dest="family", required=True, metavar="FAMILY")
    for entry in all_families().values():
        parser = per_family.add_parser(entry.name, help=entry.summary, description=f"{entry.name}: {entry.summary}")
        parser.add_argument("variant", help=f"one of: {', '.join(entry.cases)}")
        parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default: cpu)")
        if COMPILE in entry.figures:
            parser.add_argument("--compiled", action="store_true", help="wrap the workload in torch.compile")
        for param in entry.params:
            default = "derived" if param.default is None else param.default
            choices = f"; one of {', '.join(map(str, param.choices))}" if param.choices else ""
            parser.add_argument(param.flag, dest=f"param_{param.name}", metavar=param.type_name.upper(),
                                help=f"{param.help} (default {default}{choices})")
        parser.add_argument("--param", action="append", metavar="NAME=VALUE",
                            help="a parameter by name (repeatable); the same as its flag")
        parser.add_argument("--rounds", type=int, default=10, help="interleaved rounds against naive (default 10)")
        parser.add_argument("--trace", metavar="PATH", help="also write a Chrome trace of the case to PATH")
        parser.set_defaults(run=cmd_probe, parser=parser)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pitfalls", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="list the families, their variants and parameters").set_defaults(run=cmd_list)
    check = commands.add_parser("check", help="run every variant on small inputs and compare it with naive")
    check.add_argument(
        "--device", action="append", choices=("cpu", "cuda"), help="device to check on (repeatable; default: all)"
    )
    check.add_argument("--family", action="append", choices=tuple(all_families()),
                       help="family to check (repeatable; default: every family)")
    check.set_defaults(run=cmd_check)
    add_probe_parser(commands)

    report = commands.add_parser("report", help="asv results -> a markdown summary with charts")
    report.add_argument("--results", type=Path, default=Path("results"), help="asv results folder (default results)")
    report.add_argument("--out", type=Path, default=Path("report"),
                        help="folder for README.md and PNGs (default report)")
    report.add_argument("--machine", help="one asv machine name (default: every machine)")
    report.add_argument("--commit", help="a commit hash or prefix (default: each environment's newest)")
    report.set_defaults(run=cmd_report)
    register_scan(commands)
    register_calibrate(commands)
    register_scan_loader(commands)
    register_doctor(commands)
    merge.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    # Off a terminal rich would wrap tables at 80 columns; logs and CI output read better unwrapped.
    console = Console() if sys.stdout.isatty() else Console(width=160)
    subparser = getattr(args, "parser", parser)
    try:
        return int(args.run(args, console))
    except (ValueError, TypeError) as error:
        # The library names the bad value and what is allowed: that line is the message, not a traceback.
        subparser.error(str(error).splitlines()[0] if str(error) else type(error).__name__)
    return 2


if __name__ == "__main__":
    sys.exit(main())

"""The ``pitfalls`` command: list the variants, check them against naive, probe one case."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from pitfalls.cases import DEFAULT_PARAMS, SkipCase, build_case
from pitfalls.devices import available_devices
from pitfalls.equivalence import check_all
from pitfalls.probes import count_cuda_syncs, count_hazards, is_available, probe_case, render
from pitfalls.registry import FAMILIES, families, variants
from pitfalls.runner import merge

# Small cases for the sync columns of `check`: the counts do not depend on size, only on the code path.
CHECK_SIZES = {"loss": {"batch": 2, "image_size": 16}, "sampler": {"n": 1_000, "batch": 1}}


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
    columns = ("family", "variant", "device", "matches naive", "max abs diff", "sync hazards", "syncs", "failed on")
    for column in columns:
        table.add_column(column)
    notes = set()
    for row in rows:
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
    failed = [f"{r.family}/{r.variant} on {r.device}" for r in rows if not r.matches]
    if failed:
        console.print(f"[red]{len(failed)} variant(s) differ from naive:[/red] {', '.join(failed)}")
        return 1
    console.print(f"all {len(rows)} variant runs match naive")
    return 0


def sync_columns(family: str, variant: str, device: str) -> tuple[str, str]:
    """Sync hazards (any device) and real syncs (CUDA) of one call of a small case, as table cells."""
    case = build_case(family, variant, device=device, **CHECK_SIZES[family])
    case()  # warm-up: one-off work (allocator, lazy init) is not the variant's cost
    hazards = count_hazards(case).total
    syncs = count_cuda_syncs(case, calls=3, warmup=0)
    return str(hazards), (f"{syncs.per_call:g}" if is_available(syncs) else f"n/a: {syncs.reason}")


def cmd_probe(args: argparse.Namespace, console: Console) -> int:
    sizes = {name: getattr(args, name) for name in DEFAULT_PARAMS[args.family] if getattr(args, name) is not None}
    try:
        case = build_case(args.family, args.variant, device=args.device, compiled=args.compiled, **sizes)
    except SkipCase as skip:
        console.print(f"[yellow]cannot run {args.family}/{args.variant} here: {skip.reason}")
        return 2
    figures = probe_case(case, trace_path=args.trace, rounds=args.rounds)
    console.print(render(figures, title=case.name))
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pitfalls", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="list the families and their variants").set_defaults(run=cmd_list)
    check = commands.add_parser("check", help="run every variant on small inputs and compare it with naive")
    check.add_argument(
        "--device", action="append", choices=("cpu", "cuda"), help="device to check on (repeatable; default: all)"
    )
    check.set_defaults(run=cmd_check)

    probe = commands.add_parser("probe", help="run one case and print every probe's figures")
    probe.add_argument("family", choices=families())
    probe.add_argument("variant", help="a variant of the family (see `pitfalls list`)")
    probe.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default: cpu)")
    probe.add_argument("--compiled", action="store_true", help="wrap the workload in torch.compile")
    probe.add_argument("--batch", type=int, help="batch size (loss default 8, sampler default 1)")
    probe.add_argument("--image-size", dest="image_size", type=int, help="loss: image height and width (default 64)")
    probe.add_argument("--n", type=int, help="sampler: items per row (default 10000)")
    probe.add_argument("--feature-dim", dest="feature_dim", type=int, help="sampler: features per item (default 16)")
    probe.add_argument("--rounds", type=int, default=10, help="interleaved rounds against naive (default 10)")
    probe.add_argument("--trace", metavar="PATH", help="also write a Chrome trace of the case to PATH")
    probe.set_defaults(run=cmd_probe)

    report = commands.add_parser("report", help="asv results -> a markdown summary with charts")
    report.add_argument("--results", type=Path, default=Path("results"), help="asv results folder (default results)")
    report.add_argument("--out", type=Path, default=Path("report"), help="folder for README.md and PNGs (default report)")
    report.add_argument("--machine", help="one asv machine name (default: every machine)")
    report.add_argument("--commit", help="a commit hash or prefix (default: each environment's newest)")
    report.set_defaults(run=cmd_report)
    merge.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "probe" and args.variant not in variants(args.family):
        parser.error(f"{args.family} variant {args.variant!r} is not known; allowed: {', '.join(variants(args.family))}")
    # Off a terminal rich would wrap tables at 80 columns; logs and CI output read better unwrapped.
    console = Console() if sys.stdout.isatty() else Console(width=160)
    return args.run(args, console)


if __name__ == "__main__":
    sys.exit(main())

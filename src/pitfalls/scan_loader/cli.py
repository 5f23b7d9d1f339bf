"""`pitfalls scan-loader TARGET`: is my input pipeline the bottleneck?"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import torch
from rich.console import Console

from pitfalls.argtypes import positive
from pitfalls.devices import resolve_device
from pitfalls.families.loader.workers import WorkerDied
from pitfalls.scan_loader.interrupts import raise_if_received, recorded
from pitfalls.scan_loader.render import render
from pitfalls.scan_loader.scan import ScanOptions, default_workers, scan_loader
from pitfalls.scan_loader.target import TARGET_FORMS, is_users, load_loader, load_step
from pitfalls.targets import ScannedCodeError, TargetError, scanned_traceback

__all__ = ["cmd_scan_loader", "register"]

EXIT_INTERRUPTED = 130


def _stderr(line: str) -> None:
    print(f"pitfalls scan-loader: {line}", file=sys.stderr)


def _workers(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of worker counts, e.g. 0,1,2") \
            from None
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: worker counts must be 0 or more")
    return tuple(sorted(set(values)))


def cmd_scan_loader(args: argparse.Namespace, console: Console) -> int:
    """Run `pitfalls scan-loader`; returns the exit status (0; 1 a worker died; 2 bad input or the user's error)."""
    try:
        device = resolve_device(args.device)
    except ValueError as error:
        _stderr(f"--device {args.device}: {error}")
        return 2
    options = ScanOptions(device=device, workers=args.workers or default_workers(), budget_s=args.budget)
    try:
        with recorded():
            loader = load_loader(args.target, args.batch_size)
            step = load_step(args.step) if args.step else None
            report = scan_loader(loader, step, options, target=args.target, step_name=args.step or "step")
            raise_if_received()
    except TargetError as error:
        _stderr(str(error))
        return 2
    except ScannedCodeError as error:
        _stderr(f"{error} (the traceback below is from your code)")
        print(scanned_traceback(error.error, is_users), file=sys.stderr, end="")
        return 2
    except WorkerDied as error:
        _stderr(f"a worker died; every worker is stopped: {error}")
        return 1
    except KeyboardInterrupt:
        _stderr("interrupted; every worker is stopped")
        return EXIT_INTERRUPTED
    if args.json:
        print(json.dumps(report.as_json(), indent=2))
    else:
        render(report, console)
    return 0


def register(commands: Any) -> None:
    """Add the `scan-loader` subcommand to the command line's subparsers."""
    parser = commands.add_parser(
        "scan-loader",
        help="is my input pipeline the bottleneck? measure your own DataLoader",
        description=(
            "Measure your DataLoader: every tensor of a batch and the smallest dtype that holds it, steady-state "
            "samples/s at each worker count against the ceiling (the same batches from RAM), the wait in next(), "
            "the memory of the loader's processes, and advice ranked by gain."
        ),
        epilog=(f"TARGET and STEP are {TARGET_FORMS}. TARGET names a DataLoader, a Dataset, or a function of no "
                "arguments returning one (a Dataset is wrapped with --batch-size). STEP takes one batch, already on "
                "the device (or is a function of no arguments returning such a step). Exit status: 0; 1 when a "
                "worker died; 2 when TARGET or STEP cannot be loaded or your code raised; 130 on Ctrl-C."),
    )
    parser.add_argument("target", metavar="TARGET", help=TARGET_FORMS)
    parser.add_argument("--step", metavar="STEP", help="your training step, called with one batch on the device")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--budget", type=positive(float), default=60.0, metavar="SECONDS",
                        help="seconds the whole scan may take (default 60)")
    parser.add_argument("--workers", type=_workers, metavar="LIST",
                        help="num_workers values to time, e.g. 0,2,4 (default 0, 1, ... up to the cores)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="where batches are delivered: cpu, cuda or cuda:N (default cuda when present)")
    parser.add_argument("--batch-size", dest="batch_size", type=positive(int), default=32,
                        help="batch size when TARGET gives a Dataset (default 32)")
    parser.set_defaults(run=cmd_scan_loader)

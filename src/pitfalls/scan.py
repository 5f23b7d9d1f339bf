"""`pitfalls scan TARGET`: find the sync hazards in a user's own code on any device, each at its source line
(docs/scan.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table
from rich.text import Text

from pitfalls._checks import check_callable, check_int_at_least
from pitfalls.argtypes import positive
from pitfalls.hazard_guard import shown_call_sites
from pitfalls.probes.hostcopy import Provenance, keep_provenance
from pitfalls.probes.sites import HazardLocator, HazardSite, SourceLine
from pitfalls.probes.syncs import HazardCounts
from pitfalls.probes.trace import export_trace
from pitfalls.targets import FORMS, ScannedCodeError, TargetError, call_scanned, load_target, scanned_traceback

__all__ = ["ScanReport", "cmd_scan", "register", "scan_step"]

DEFAULT_CALLS = 3


@dataclass(frozen=True)
class ScanReport:
    """The hazards of a scanned step.

    Attributes:
        target: what was scanned.
        calls: counted calls.
        warmup: uncounted calls before them.
        sites: the hazards by source line, most frequent first; counts are over all counted calls.
        counts: the hazard counter's own totals over the counted calls, by label.
        trace: the Chrome trace written, if one was asked for.
    """

    target: str
    calls: int
    warmup: int
    sites: tuple[HazardSite, ...]
    counts: HazardCounts
    trace: str | None = None

    @property
    def per_call(self) -> float:
        """Hazards per call, every kind together."""
        return self.counts.total / self.calls

    def as_json(self) -> dict[str, Any]:
        """The report as plain JSON values; paths are absolute."""
        return {
            "target": self.target,
            "calls": self.calls,
            "warmup": self.warmup,
            "eager": self.counts.eager,
            "hazards_per_call": self.per_call,
            "trace": self.trace,
            "hazards": [
                {
                    **_line_json(site.line),
                    "op": site.kind.op,
                    "label": site.label,
                    "backward": site.in_backward,
                    "count": site.count,
                    "per_call": site.count / self.calls,
                    "rewrite": site.kind.rewrite,
                    "call_sites": [{"count": call.count, "per_call": call.count / self.calls,
                                    "frames": [_line_json(frame) for frame in call.frames]}
                                   for call in site.call_sites],
                }
                for site in self.sites
            ],
        }


def _line_json(line: SourceLine | None) -> dict[str, Any]:
    """A source line as JSON values: its path, number, function and code (each None without a line)."""
    if line is None:
        return dict.fromkeys(("path", "line", "function", "code"))
    return {"path": line.path, "line": line.lineno, "function": line.function, "code": line.code}


def scan_step(step: Callable[[], object], *, calls: int = DEFAULT_CALLS, warmup: int = 1,
              trace: str | Path | None = None, name: str = "step", provenance: Provenance | None = None) -> ScanReport:
    """Run `step` `warmup` times (recording what it makes on the host: `keep_provenance`), then `calls` times under a
    `HazardLocator`, and report its hazards by line.

    Args:
        step: a zero-argument callable, e.g. one training step.
        calls: counted calls (>= 1).
        warmup: uncounted calls first (>= 0), so one-off work (lazy initialisation) is not counted.
        trace: also write a Chrome trace of the counted calls here, hazards in "sync-hazard: <op>" ranges.
        name: how the report names the step.
        provenance: the host-made tensors of earlier calls of the step (None: none known).

    Returns:
        A `ScanReport`.

    Raises:
        ScannedCodeError: the step raised; the error keeps the step's own exception.
    """
    check_callable("step", step)
    check_int_at_least("calls", calls, 1)
    check_int_at_least("warmup", warmup, 0)
    provenance = provenance if provenance is not None else Provenance()
    with keep_provenance(provenance):
        for _ in range(warmup):
            call_scanned(name, "warming up", step)
    with HazardLocator(provenance=provenance) as locator:
        if trace is None:
            for _ in range(calls):
                call_scanned(name, "running under the hazard counter", step)
        else:
            export_trace(lambda: call_scanned(name, "running under the profiler", step), trace, steps=calls, warmup=0,
                         device="cuda" if torch.cuda.is_available() else None)
    found = locator.result
    return ScanReport(name, calls, warmup, found.sites, found.counts, str(trace) if trace is not None else None)


def _calls(report: ScanReport) -> str:
    def calls(n: int) -> str:
        return f"{n} call" if n == 1 else f"{n} calls"

    return f"{calls(report.calls)} counted after {calls(report.warmup)} of warm-up"


def render(report: ScanReport, console: Console) -> None:
    """Print a report as a table ranked by count, or say that nothing was found."""
    if not report.sites:
        console.print(Text(f"no sync hazards found in {report.target} ({_calls(report)})"))
        return
    table = Table(title=Text(f"sync hazards in {report.target}: {report.per_call:g} per call ({_calls(report)})"))
    table.add_column("where", no_wrap=True)
    table.add_column("code", max_width=52, overflow="ellipsis", no_wrap=True)
    table.add_column("op", max_width=24)
    table.add_column("per call", justify="right", no_wrap=True)
    table.add_column("rewrite that removes it", ratio=1)
    for site in report.sites:
        where = site.line.short_where() if site.line else "(no frame outside torch)"
        code = site.line.code if site.line else ""
        # Text, not markup: code such as x[mask] would otherwise be read as a rich style tag.
        cells = (where, code, site.kind.op, f"{site.count / report.calls:g}", site.kind.rewrite)
        table.add_row(*(Text(cell) for cell in cells))
        for call in shown_call_sites(site):
            caller = call.frames[0]
            dim = (f"  <- {caller.short_where()}", caller.code, "called from", f"{call.count / report.calls:g}")
            table.add_row(*(Text(cell, style="dim") for cell in dim), Text(""))
    console.print(table)
    console.print("counted on the eager program (compiled code runs eagerly while scanned); backward ops are shown "
                  "at the forward line that built them; a line reached from several callers lists them under it (<-); "
                  "--json gives every caller chain")


def _stderr(line: str) -> None:
    print(f"pitfalls scan: {line}", file=sys.stderr)


def cmd_scan(args: argparse.Namespace, console: Console) -> int:
    """Run `pitfalls scan`; returns the exit status (0, 1 with --fail-on-hazards when any are found, 2)."""
    if args.trace is not None and not Path(args.trace).parent.is_dir():
        _stderr(f"--trace {args.trace}: the folder {Path(args.trace).parent} does not exist")
        return 2
    provenance = Provenance()
    try:
        target = load_target(args.target, first_call=lambda: keep_provenance(provenance))
        if not target.warmed_up:
            provenance = Provenance()  # a factory's set-up, not a step: what it made counts as the device's
        report = scan_step(
            target.step, calls=args.calls, warmup=0 if target.warmed_up else 1, trace=args.trace, name=args.target,
            provenance=provenance,
        )
        if target.warmed_up:  # loading the target called the step once: that was its warm-up
            report = dataclasses.replace(report, warmup=report.warmup + 1)
    except TargetError as error:
        _stderr(str(error))
        return 2
    except ScannedCodeError as error:
        _stderr(f"{error} (the traceback below comes from the scanned code)")
        print(scanned_traceback(error.error), file=sys.stderr, end="")
        return 2
    if args.json:
        print(json.dumps(report.as_json(), indent=2))
    else:
        render(report, console)
        if report.trace:
            console.print(Text(f"trace written to {report.trace} (open in https://ui.perfetto.dev)"))
    return 1 if args.fail_on_hazards and report.sites else 0


def register(commands: Any) -> None:
    """Add the `scan` subcommand to the command line's subparsers."""
    parser = commands.add_parser(
        "scan",
        help="find the sync hazards in your own code, each at its source line",
        description=(
            "Run TARGET once to warm up, then --calls times under the sync-hazard counter, on any device, and "
            "list each hazard at the line of your code that dispatched it, with the rewrite that removes it."
        ),
        epilog=(
            f"TARGET is {FORMS}. NAME is called once with no arguments (it must need none): if that call returns "
            "a callable, NAME is a factory and what it returned is the step, warmed up once more; otherwise NAME "
            "is the step and that call was its warm-up. FAMILY/VARIANT is one of the suite's cases "
            "(pitfalls list), e.g. loss/naive. Exit status: 0, 1 with --fail-on-hazards when any hazard is "
            "found, 2 when TARGET cannot be loaded or run."
        ),
    )
    parser.add_argument("target", metavar="TARGET", help=FORMS)
    parser.add_argument("--calls", type=positive(int), default=DEFAULT_CALLS,
                        help=f"counted calls after the warm-up (default {DEFAULT_CALLS})")
    parser.add_argument("--json", action="store_true", help="print the report as JSON instead of a table")
    parser.add_argument("--trace", metavar="PATH", help="also write a Chrome trace with the hazards as labelled ranges")
    parser.add_argument("--fail-on-hazards", dest="fail_on_hazards", action="store_true",
                        help="exit 1 when any hazard is found")
    parser.set_defaults(run=cmd_scan)

"""``scripts/gpu-run merge ARCHIVE``: a budgeted run brought home (`pitfalls.gpu_run.merge`), then the README's claims
table generated again (`pitfalls.report.claims`): two layers' steps, composed in the report's layer.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from pitfalls.checkout import ROOT, NoCheckout, require_checkout
from pitfalls.gpu_run.costs import COSTS
from pitfalls.gpu_run.merge import MergeOptions, merge_run
from pitfalls.report.claims import update_readme

__all__ = ["main"]

PROG = "gpu-run merge"


def main(argv: Sequence[str] | None = None) -> int:
    """Merge a run, then regenerate the claims table; returns the exit status (2 with one line on bad input)."""
    try:
        require_checkout("scripts/gpu-run")
    except NoCheckout as error:
        print(f"{PROG}: {error}", file=sys.stderr)
        return 2
    parser = argparse.ArgumentParser(prog=PROG, description="Bring a run into the checkout.")
    parser.add_argument("source", type=Path, help="the run's archive (.tar.gz) or folder")
    parser.add_argument("--results", type=Path, default=ROOT / "results")
    parser.add_argument("--proof", type=Path, default=ROOT / "proof")
    parser.add_argument("--costs", type=Path, default=COSTS)
    parser.add_argument("--readme", type=Path, default=ROOT / "README.md",
                        help="the README whose claims table is regenerated")
    parser.add_argument("--no-publish", dest="publish", action="store_false", help="do not republish the site")
    args = parser.parse_args(argv)
    if not args.source.exists():
        parser.error(f"{args.source}: no such archive or folder")
    try:
        done = merge_run(args.source, MergeOptions(args.results, args.proof, args.costs, ROOT / "asv.conf.json",
                                                   args.publish))
        update_readme(args.readme, args.results, args.proof)
    except ValueError as error:
        parser.error(str(error))
    print("\n".join([*done, f"claims table regenerated in {args.readme}"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

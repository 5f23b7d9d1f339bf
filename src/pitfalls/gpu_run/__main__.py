"""Command line of ``scripts/gpu-run``: a run, ``bring`` and ``plan`` (docs/gpu.md); its ``merge`` form is
`pitfalls.report.gpu_merge`'s.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from pitfalls.checkout import ROOT, NoCheckout, require_checkout
from pitfalls.gpu_run.costs import COSTS, Costs
from pitfalls.gpu_run.pieces import PIECES, run_piece
from pitfalls.gpu_run.run import RunOptions, run

PROG = "gpu-run"


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: the budget must be more than 0 seconds")
    return value


def _run(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description="The GPU work in a fixed priority order, within a budget.")
    parser.add_argument("out", type=Path, help="a new or empty folder for the run's files")
    parser.add_argument("--budget", type=_positive, required=True, metavar="SECONDS",
                        help="seconds for the whole run; a piece whose cost does not fit is left out, never run half")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cuda (the run), or cpu (a rehearsal of the same pieces at small sizes)")
    parser.add_argument("--archive", type=Path, help="pack the run into this .tar.gz after every piece")
    parser.add_argument("--only", default="", metavar="PIECE[,PIECE]", help="run these pieces alone")
    parser.add_argument("--costs", type=Path, default=COSTS, help=f"the cost file (default {COSTS.relative_to(ROOT)})")
    parser.add_argument("--record-costs", action="store_true",
                        help="fold what the pieces took into the cost file at the end")
    args = parser.parse_args(argv)
    only = [name.strip() for name in args.only.split(",") if name.strip()]
    if args.device == "cuda":
        from pitfalls.devices import cuda_available

        if not cuda_available():
            parser.error("no CUDA device here; run on a GPU machine, or rehearse with --device cpu")
    try:
        return run(args.out, RunOptions(budget_s=args.budget, device=args.device, costs_file=args.costs,
                                        archive=args.archive, only=tuple(only),
                                        record_costs=args.record_costs))
    except ValueError as error:
        parser.error(str(error))
    return 2


def _bring(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog=f"{PROG} bring", description="What an offline GPU machine needs: the commit (a git bundle) and asv's "
                                          "wheels, in one folder to carry (scripts/gpu-run-offline reads it).")
    parser.add_argument("dest", type=Path, help="the folder to fill (e.g. .gpu-run, which git ignores)")
    parser.add_argument("--wheels", type=Path, required=True,
                        help="a folder of wheels for the GPU machine's Python (asv, asv-runner and their needs)")
    args = parser.parse_args(argv)
    wheels = sorted(args.wheels.glob("*.whl")) if args.wheels.is_dir() else []
    if not any(w.name.startswith("asv-") for w in wheels) or not any(w.name.startswith("asv_runner-") for w in wheels):
        parser.error(f"--wheels {args.wheels}: no asv and asv_runner wheels there")
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.strip()
    if dirty:
        parser.error("the checkout has uncommitted changes: commit first, so that the results carry a real commit")
    (args.dest / "wheels").mkdir(parents=True, exist_ok=True)
    for wheel in wheels:
        shutil.copy2(wheel, args.dest / "wheels" / wheel.name)
    subprocess.run(["git", "bundle", "create", str((args.dest / "head.bundle").resolve()), "HEAD"], cwd=ROOT,
                   check=True, capture_output=True)
    size = sum(f.stat().st_size for f in args.dest.rglob("*") if f.is_file())
    print(f"{args.dest}: the commit and {len(wheels)} wheels, {size / 2**20:.1f} MiB")
    return 0


def _plan(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog=f"{PROG} plan", description="The pieces in order, with their costs.")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--kind", help="the cost file's kind (default: cpu, or gpu-nvidia-h200 for cuda)")
    parser.add_argument("--budget", type=_positive, help="also say which pieces would fit, in order")
    parser.add_argument("--costs", type=Path, default=COSTS)
    args = parser.parse_args(argv)
    kind = args.kind or ("cpu" if args.device == "cpu" else "gpu-nvidia-h200")
    try:
        costs = Costs.read(args.costs)
    except ValueError as error:
        parser.error(str(error))
    left = args.budget
    for piece in PIECES:
        seconds, source = costs.cost(piece, kind, args.device)
        verdict = ""
        if left is not None:
            verdict = "  fits" if seconds <= left else "  over budget"
            left -= seconds if seconds <= left else 0
        print(f"{piece.group}  {seconds:6.0f} s  {source:24}  {piece.name}{verdict}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch ``scripts/gpu-run``'s forms; returns the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        require_checkout("scripts/gpu-run")
    except NoCheckout as error:
        print(f"{PROG}: {error}", file=sys.stderr)
        return 2
    commands = {"bring": _bring, "plan": _plan}
    if args and args[0] == "piece":  # one piece, in a process of its own (the run starts these)
        if len(args) != 3:
            print(f"{PROG} piece: usage: {PROG} piece NAME OUT", file=sys.stderr)
            return 2
        return run_piece(args[1], Path(args[2]))
    if args and args[0] in commands:
        return commands[args[0]](args[1:])
    return _run(args)


if __name__ == "__main__":
    sys.exit(main())

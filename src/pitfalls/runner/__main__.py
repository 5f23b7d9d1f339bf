"""``python -m pitfalls.runner suite|history|compare|machine|relabel ...``: what the scripts/ wrappers call."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from pitfalls.runner import compare, history, job, relabel


def _machine(argv: Sequence[str]) -> int:
    """Record this machine's facts for asv (the main job's machine step) and print them as JSON."""
    parser = argparse.ArgumentParser(prog="python -m pitfalls.runner machine", description=_machine.__doc__)
    parser.add_argument("--results", type=Path, default=Path("results"),
                        help="the results folder holding recorded facts")
    args = parser.parse_args(argv)

    def run() -> int:
        print(json.dumps(job.prepare_machine(args.results).facts, indent=2, sort_keys=True))
        return 0

    return job.report_errors(run)


COMMANDS = {"suite": job.main, "history": history.main, "compare": compare.main, "machine": _machine,
            "relabel": relabel.main}


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch to the named command."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in COMMANDS:
        print(f"usage: python -m pitfalls.runner {{{','.join(COMMANDS)}}} [arguments]", file=sys.stderr)
        return 2
    return COMMANDS[args[0]](args[1:])


if __name__ == "__main__":
    sys.exit(main())

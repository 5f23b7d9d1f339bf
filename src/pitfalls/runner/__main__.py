"""``python -m pitfalls.runner suite|history|compare|machine|relabel ...``: what the scripts/ wrappers call."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence


def _machine(argv: Sequence[str]) -> int:
    """Record this machine's facts for asv (the main job's machine step) and print them as JSON."""
    import argparse
    import json

    from pitfalls.runner.job import prepare_machine, report_errors

    parser = argparse.ArgumentParser(prog="python -m pitfalls.runner machine", description=_machine.__doc__)
    parser.add_argument("--results", default="results", help="the results folder holding recorded facts")
    args = parser.parse_args(argv)

    def run() -> int:
        from pathlib import Path

        record = prepare_machine(Path(args.results), sys.executable)
        print(json.dumps(record.facts, indent=2, sort_keys=True))
        return 0

    return report_errors(run)


def _commands() -> dict[str, Callable[[Sequence[str]], int]]:
    from pitfalls.runner import compare, history, job, relabel

    return {"suite": job.main, "history": history.main, "compare": compare.main, "machine": _machine,
            "relabel": relabel.main}


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch to the named command."""
    args = list(sys.argv[1:] if argv is None else argv)
    commands = _commands()
    if not args or args[0] not in commands:
        print(f"usage: python -m pitfalls.runner {{{','.join(commands)}}} [arguments]", file=sys.stderr)
        return 2
    return commands[args[0]](args[1:])


if __name__ == "__main__":
    sys.exit(main())

"""``python -m pitfalls.runner suite|history|compare|relabel ...``: what the scripts/ wrappers call."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from pitfalls.runner import compare, history, job, relabel

COMMANDS = {"suite": job.main, "history": history.main, "compare": compare.main, "relabel": relabel.main}


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch to the named command."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in COMMANDS:
        print(f"usage: python -m pitfalls.runner {{{','.join(COMMANDS)}}} [arguments]", file=sys.stderr)
        return 2
    return COMMANDS[args[0]](args[1:])


if __name__ == "__main__":
    sys.exit(main())

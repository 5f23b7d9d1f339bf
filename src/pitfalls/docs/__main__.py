"""``python -m pitfalls.docs [--root DIR] [--write]``: check (or write) the generated pages and their links."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from pitfalls.docs.generate import Docs


def main(argv: Sequence[str] | None = None) -> int:
    """Exit 0 when every page is current and every link resolves, 1 naming what is not, 2 on bad input."""
    parser = argparse.ArgumentParser(prog="python -m pitfalls.docs", description=__doc__)
    parser.add_argument("--root", type=Path, default=Path("."), help="the repository's root (default: .)")
    parser.add_argument("--write", action="store_true", help="write the pages and pictures that differ")
    args = parser.parse_args(argv)
    if not (args.root / "docs").is_dir() or not (args.root / "results").is_dir():
        parser.error(f"--root {str(args.root)!r} is not the repository's root (it needs docs/ and results/)")
    docs = Docs(args.root)
    try:
        if args.write:
            for path in docs.write():
                print(f"wrote {path}")
        stale = docs.stale()
    except ValueError as error:
        parser.error(str(error).splitlines()[0])
    broken = docs.broken_links()
    for problem in stale + broken:
        print(problem, file=sys.stderr)
    if stale:
        print("run `python -m pitfalls.docs --write` to generate the stale pages", file=sys.stderr)
    return 1 if stale or broken else 0


if __name__ == "__main__":
    sys.exit(main())

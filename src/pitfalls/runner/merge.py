"""``pitfalls merge``: several machines' results folders into one, and one site for all of them.

asv keeps one ``results/<machine>/`` folder per machine, so a fleet's results (each GPU kind running the same
image) come together by merging folders: each results file key by key, each machine.json fact by fact, and the
suites' ``benchmarks.json``. Two folders whose suites disagree (a benchmark with another version, i.e. other
code, or other parameters) cannot share one site: asv would silently drop the results of one of them, so the merge
is refused before anything is written.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pitfalls.asv_files import BENCHMARKS, SUITE_API, read_json
from pitfalls.runner import store
from pitfalls.runner.conf import CONF_NAME, RunnerError, project_paths, write_staged_conf

__all__ = ["merge_folders", "register", "run_merge"]


def _suite(folder: Path) -> dict[str, Any]:
    path = folder / BENCHMARKS
    if not path.is_file():
        raise RunnerError(f"{folder}: not an asv results folder (no {BENCHMARKS})")
    with store.readable():
        return read_json(path, SUITE_API)


def check_suites(folders: Sequence[Path], out: Path) -> None:
    """Refuse folders whose benchmarks.json describe different suites (each against the others and ``out``).

    Raises:
        RunnerError: naming the two files, how many benchmarks differ and the first of them.
    """
    seen: list[tuple[Path, dict[str, Any]]] = []
    if (out / BENCHMARKS).is_file():
        seen.append((out, _suite(out)))
    for folder in folders:
        suite = _suite(folder)
        for other, other_suite in seen:
            differ = store.suite_conflicts(other_suite, suite)
            if differ:
                first = differ[0]
                what = next(key for key in store.SUITE_FIELDS if other_suite[first].get(key) != suite[first].get(key))
                raise RunnerError(
                    f"{other / BENCHMARKS} and {folder / BENCHMARKS} describe different suites: "
                    f"{len(differ)} benchmark(s) differ, e.g. {first} ({what} {other_suite[first].get(what)!r} vs "
                    f"{suite[first].get(what)!r}); measure every machine with the same commit of benchmarks/"
                )
        seen.append((folder, suite))


def merge_folders(folders: Sequence[str | Path], out: str | Path) -> dict[Path, list[str]]:
    """Merge results folders into ``out`` (created if missing), under its lock, refusing conflicting suites.

    Args:
        folders: asv results folders (each holds benchmarks.json and one folder per machine).
        out: the results folder they are merged into.

    Returns:
        For each folder, the relative paths it wrote under ``out``.

    Raises:
        RunnerError: a folder is not a results folder, the suites conflict, or a file cannot be read or written;
            ``out`` is then unchanged.
    """
    target = Path(out).resolve()
    sources = [Path(folder).resolve() for folder in folders]
    sources = [source for source in dict.fromkeys(sources) if source != target]
    for source in sources:
        if not source.is_dir():
            raise RunnerError(f"{source}: no such folder; pass asv results folders (each holds {BENCHMARKS})")
    check_suites(sources, target)
    store.check_writable(target)
    written: dict[Path, list[str]] = {}
    with store.locked(target):
        for source in sources:
            written[source] = store.merge_into(source, target, suite="union")
    return written


def run_merge(folders: Sequence[str], out: str, html: str | None, config: str, publish: bool = True) -> int:
    """The ``pitfalls merge`` command; returns the exit status (2 with one line on stderr for bad input)."""
    import subprocess

    try:
        site = Path(html) if html is not None else project_paths(config)["html_dir"]
        if publish:
            store.check_writable(site)
        written = merge_folders(folders, out)
    except RunnerError as error:
        print(f"pitfalls merge: {error}", file=sys.stderr)
        return 2
    for source, files in written.items():
        print(f"merged {source}: {len(files)} file(s) written into {out}")
    if not publish:
        return 0
    with tempfile.TemporaryDirectory(prefix="pitfalls-merge-") as scratch, store.locked(out):
        conf = write_staged_conf(config, scratch, results_dir=out, html_dir=html)
        done = subprocess.run([sys.executable, "-m", "pitfalls.site.localize", "--config", str(conf)], check=False)
    if done.returncode != 0:
        print(f"pitfalls merge: publishing the site failed (exit {done.returncode}); the results are merged",
              file=sys.stderr)
        return done.returncode
    print(f"site: {site}/index.html (serve it with: bash scripts/serve {site})")
    return 0


def register(subparsers: Any) -> None:
    """Add ``merge`` to the ``pitfalls`` command line."""
    merge = subparsers.add_parser(
        "merge",
        help="merge several machines' asv results folders and publish one site",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    merge.add_argument("folders", nargs="+", metavar="DIR", help="asv results folders (one or more machines each)")
    merge.add_argument("--out", default="results", help="the results folder to merge into (default results)")
    merge.add_argument("--html", default=None, help="the site folder (default: asv.conf.json's html_dir)")
    merge.add_argument("--config", default=CONF_NAME, help="the asv configuration (default asv.conf.json)")
    merge.add_argument("--no-publish", dest="publish", action="store_false", help="merge only")
    merge.set_defaults(run=lambda args, *_: run_merge(args.folders, args.out, args.html, args.config, args.publish))

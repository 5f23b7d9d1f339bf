"""The one reader of asv's results folder: ``benchmarks.json``, ``<machine>/machine.json``, and the results files
``<machine>/<commit>-<env>.json``, each read by asv's own loader, so every reader sees what asv's site sees.

asv is imported when a file is read (processes that import the core must not import it). A file asv cannot read
raises `Unreadable`, which says why in one line.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

__all__ = ["BENCHMARKS", "MACHINE", "MACHINE_API", "SUITE_API", "Unreadable", "durations", "file_name", "header",
           "load", "machines", "read_json", "result_files"]

BENCHMARKS = "benchmarks.json"
MACHINE = "machine.json"
SUITE_API = 2  # asv's Benchmarks.api_version
MACHINE_API = 1  # asv's Machine.api_version
# asv's key of a setup_cache's duration: "<setup_cache bench_loss:12>".
_SETUP_CACHE = re.compile(r"<setup_cache (?P<module>\w+):\d+>")
# What a results file says about itself in its first bytes (asv writes these keys first).
_HEADER = {
    "commit": re.compile(r'"commit_hash":\s*"([0-9a-fA-F]+)"'),
    "env": re.compile(r'"env_name":\s*"([^"]+)"'),
    "date": re.compile(r'"date":\s*(\d+)'),
}


class Unreadable(ValueError):
    """A file asv cannot read: its ``path``, and the ``reason`` in one line without the path."""

    def __init__(self, path: str | os.PathLike[str], reason: str) -> None:
        self.path, self.reason = Path(path), " ".join(reason.split())
        super().__init__(f"{self.path}: cannot be read: {self.reason}")


def _reason(path: str | os.PathLike[str], error: BaseException, kind: str) -> str:
    from asv import util

    if isinstance(error, OSError):
        return f"cannot be opened: {error.strerror or error}"
    if isinstance(error, util.UserError):  # its message names the path, which the caller names already
        text, where = str(error), os.path.abspath(path)
        for named in (f" in file '{where}'", f" '{where}'", f" in {where}", f"{where} "):
            text = text.replace(named, "")
        return text
    # asv's loader assumes well-formed JSON of the right shapes; a hand-damaged file fails in these ways.
    return f"not an asv {kind} ({type(error).__name__}: {error})"


def machines(results_dir: str | os.PathLike[str]) -> list[str]:
    """The machines of a results folder (its folders holding ``machine.json``), by name."""
    return sorted(path.parent.name for path in Path(results_dir).glob(f"*/{MACHINE}"))


def result_files(results_dir: str | os.PathLike[str], machine: str | None = None) -> list[str]:
    """The results files under ``results_dir`` (of ``machine`` only, if given), as sorted relative paths."""
    folder = Path(results_dir)
    return sorted(path.relative_to(folder).as_posix() for path in folder.glob(f"{machine or '*'}/*.json")
                  if path.name not in (MACHINE, BENCHMARKS))


def file_name(machine: str, commit: str, env_name: str) -> str:
    """The relative path asv gives the results of ``commit`` in ``env_name`` on ``machine``."""
    from asv.results import get_filename

    return get_filename(machine, commit, env_name)


def load(path: str | os.PathLike[str], machine: str | None = None) -> Any:
    """One results file as asv's ``Results``.

    Args:
        path: the file.
        machine: the machine it must belong to, if any.

    Raises:
        Unreadable: asv cannot read it (not JSON, another format, damaged, another machine's).
    """
    from asv import util
    from asv.results import Results

    try:
        return Results.load(str(path), machine_name=machine)
    except (util.UserError, OSError, KeyError, TypeError, ValueError, AttributeError) as error:
        raise Unreadable(path, _reason(path, error, "results file")) from error


def read_json(path: str | os.PathLike[str], api_version: int) -> dict[str, Any]:
    """benchmarks.json (`SUITE_API`) or a machine.json (`MACHINE_API`), without asv's ``version`` key.

    Raises:
        Unreadable: not such a file of that asv format.
    """
    from asv import util

    try:
        # With an api_version asv reads only an object holding a "version" key (a list or a string fails here).
        return util.load_json(str(path), api_version=api_version)
    except (util.UserError, OSError, TypeError, ValueError) as error:
        raise Unreadable(path, _reason(path, error, Path(path).name)) from error


def durations(results: Any) -> tuple[dict[str, float], dict[str, float]]:
    """The seconds asv recorded in one results file: per benchmark (all its parameter sets), per setup-cache module."""
    benchmarks = {name: float(seconds) for name in results.get_all_result_keys()
                  if (seconds := results.duration.get(name)) is not None}
    caches: dict[str, float] = {}
    for key, seconds in results.duration.items():
        if match := _SETUP_CACHE.fullmatch(key):
            caches[match["module"]] = caches.get(match["module"], 0.0) + float(seconds)
    return benchmarks, caches


def header(path: Path) -> dict[str, Any]:
    """The commit, environment and date a results file that cannot be read names in its first bytes, else its name."""
    try:
        text = path.read_bytes()[:4096].decode("utf-8", errors="replace")
    except OSError:
        text = ""
    found: dict[str, Any] = {key: (m.group(1) if (m := p.search(text)) else None) for key, p in _HEADER.items()}
    stem_commit, _, stem_env = path.stem.partition("-")
    found["commit"] = found["commit"] or (stem_commit if re.fullmatch(r"[0-9a-fA-F]+", stem_commit) else None)
    found["env"] = found["env"] or stem_env or None
    found["date"] = int(found["date"]) if found["date"] else None
    return found

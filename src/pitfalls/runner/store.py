"""The results folder: a lock, and a key-by-key merge of other results into it through asv's results API.

asv keeps one file per machine, commit and environment, holding one entry per benchmark. Copying whole files
back from a staging folder loses whatever another run wrote into the same file meanwhile (two main jobs of
different ``-b`` subsets on one commit: the second copy erased the first's figures). Here each file is merged
benchmark by benchmark with what is already there, under an exclusive ``flock`` on ``<results>/.lock``, and only
the benchmarks a run measured are taken from it.

Nothing under the folder changes until every merged file has been written beside its target (``*.partial-<pid>``,
a name asv never reads); then each replaces its target by an atomic rename. A source or target that cannot be
read stops the merge before anything is replaced. Files are read by `pitfalls.asv_files`; this module is the one
that writes them.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pitfalls import asv_files
from pitfalls.asv_files import BENCHMARKS, MACHINE, MACHINE_API, SUITE_API, load, read_json, result_files
from pitfalls.runner.conf import RunnerError, one_line

__all__ = ["LOCK_NAME", "Snapshot", "check_writable", "locked", "merge_into", "readable", "save_atomically", "snapshot",
           "suite_conflicts"]

LOCK_NAME = ".lock"
UNREADABLE = "<unreadable sha256>"
# The per-benchmark tables of asv.results.Results: the ones its own load_data() carries over from an old file.
PER_BENCHMARK = ("_results", "_samples", "_stats", "_benchmark_params", "_profiles", "_started_at", "_duration",
                 "_benchmark_version")
# What makes two benchmarks.json entries the same benchmark (version is asv's hash of the benchmark's code).
SUITE_FIELDS = ("version", "type", "unit", "params", "param_names")

# relative path of a results file -> entry -> marker of its measurement (started_at, or a <build>/<setup_cache>
# duration): an entry whose marker is unchanged after a run was not measured by that run.
Snapshot = dict[str, dict[str, Any]]


def check_writable(*folders: str | os.PathLike[str]) -> None:
    """Check that each folder (or, if it does not exist yet, its nearest existing parent) accepts new files.

    Raises:
        RunnerError: naming the first folder that cannot be written, before anything is measured.
    """
    for folder in folders:
        path = Path(folder).resolve()
        probe = path
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        if not probe.is_dir():
            raise RunnerError(f"{path}: not a folder; results and the site need a folder they can write to")
        try:
            tempfile.NamedTemporaryFile(dir=probe, prefix=".write-check-").close()
        except OSError as error:
            raise RunnerError(f"{path} is not writable ({error.strerror or one_line(error)}); nothing was measured") \
                from error


@contextmanager
def locked(results_dir: str | os.PathLike[str]) -> Iterator[Path]:
    """Hold an exclusive ``flock`` on ``<results_dir>/.lock`` (waiting for other holders); yields the folder."""
    folder = Path(results_dir)
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield folder
    finally:
        os.close(fd)


@contextmanager
def readable() -> Iterator[None]:
    """Turn a file `pitfalls.asv_files` cannot read into the runner's one-line error naming it (a RunnerError)."""
    try:
        yield
    except asv_files.Unreadable as error:
        raise RunnerError(str(error)) from error


def _markers(results: Any) -> dict[str, Any]:
    markers: dict[str, Any] = {key: results._started_at.get(key) for key in results.get_all_result_keys()}
    markers.update({key: value for key, value in results._duration.items() if key.startswith("<")})
    return markers


def _markers_or_digest(path: Path) -> dict[str, Any]:
    # A damaged file (truncated by a full disk, say) is remembered by its bytes: a run that leaves it alone must
    # not be stopped by it, and one that rewrites it is seen to have done so.
    try:
        return _markers(asv_files.load(path))
    except asv_files.Unreadable:
        return {UNREADABLE: hashlib.sha256(path.read_bytes()).hexdigest()}


def snapshot(results_dir: str | os.PathLike[str]) -> Snapshot:
    """What each results file under ``results_dir`` holds now, to tell later which entries a run measured."""
    folder = Path(results_dir)
    return {relative: _markers_or_digest(folder / relative) for relative in result_files(folder)}


def _empty_like(results: Any, relative: str) -> Any:
    from asv.results import Results

    fresh = Results(dict(results.params), dict(results._requirements), results.commit_hash, results.date,
                    results._python, results.env_name, dict(results.env_vars))
    fresh._filename = relative
    return fresh


def _merge_results(source: Any, target: Any | None, relative: str, before: Mapping[str, Any] | None) -> Any:
    """``target`` with the entries of ``source`` that are new since ``before`` (all of them when it is None)."""
    merged = target if target is not None else _empty_like(source, relative)
    taken = [key for key, marker in _markers(source).items()
             if before is None or key not in before or before[key] != marker]
    for key in taken:
        if key.startswith("<"):
            merged._duration[key] = source._duration[key]
            continue
        for table in PER_BENCHMARK:
            values = getattr(source, table)
            if key in values:
                getattr(merged, table)[key] = values[key]
            else:
                getattr(merged, table).pop(key, None)
    # The header follows the newest run; params only grow, so no machine fact is ever dropped.
    merged._params = {**merged.params, **source.params}
    merged._date = source.date
    return merged


def suite_conflicts(first: Mapping[str, Any], second: Mapping[str, Any]) -> list[str]:
    """Benchmarks that both ``benchmarks.json`` contents hold with a different version, type, unit or params."""
    return sorted(name for name in set(first) & set(second)
                  if isinstance(first[name], dict) and isinstance(second[name], dict)
                  and any(first[name].get(key) != second[name].get(key) for key in SUITE_FIELDS))


@dataclass(frozen=True)
class _Write:
    relative: str
    data: Any  # an asv Results object, or a JSON dict with its asv api version
    api_version: int | None = None


def _plan(source: Path, target: Path, before: Snapshot | None, suite: str) -> list[_Write]:
    writes: list[_Write] = []
    if (source / BENCHMARKS).is_file():
        new = read_json(source / BENCHMARKS, SUITE_API)
        old = read_json(target / BENCHMARKS, SUITE_API) if (target / BENCHMARKS).is_file() else {}
        # "replace": a run's benchmarks.json is the whole suite as it now is. "union": results of other folders.
        merged = new if suite == "replace" else {**old, **new}
        if merged != old:
            writes.append(_Write(BENCHMARKS, merged, SUITE_API))
    for machine_file in sorted(source.glob(f"*/{MACHINE}")):
        relative = machine_file.relative_to(source).as_posix()
        new = read_json(machine_file, MACHINE_API)
        old = read_json(target / relative, MACHINE_API) if (target / relative).is_file() else {}
        merged = {**new, **{key: value for key, value in old.items() if value not in (None, "")}}
        if merged != old:
            writes.append(_Write(relative, merged, MACHINE_API))
    for relative in result_files(source):
        if before is not None and before.get(relative) == _markers_or_digest(source / relative):
            continue  # the run did not touch this file
        staged = load(source / relative)
        current = load(target / relative) if (target / relative).is_file() else None
        writes.append(_Write(relative, _merge_results(staged, current, relative, None if before is None else
                                                       before.get(relative, {}))))
    return writes


def merge_into(source: str | os.PathLike[str], target: str | os.PathLike[str], *, before: Snapshot | None = None,
               suite: str = "replace") -> list[str]:
    """Merge the asv results folder ``source`` into ``target``, key by key; call it holding :func:`locked`.

    Args:
        source: a results folder (a staging copy, or another machine's results).
        target: the results folder to merge into (created if missing).
        before: the :func:`snapshot` ``source`` was taken from; only entries changed since are merged. None
            merges every entry of ``source``.
        suite: "replace" to take ``source``'s benchmarks.json as the suite (a run of this checkout), "union"
            to add its benchmarks to ``target``'s (check :func:`suite_conflicts` first).

    Returns:
        The relative paths written under ``target``.

    Raises:
        RunnerError: a file cannot be read or written; ``target`` is then unchanged.
    """
    source_dir, target_dir = Path(source), Path(target)
    with readable():
        writes = _plan(source_dir, target_dir, before, suite)
    _write_all(writes, target_dir)
    return [write.relative for write in writes]


def _write_all(writes: list[_Write], target_dir: Path) -> None:
    """Write every file beside its target, then rename each into place; on a failure nothing is replaced."""
    from asv import util

    suffix = f".partial-{os.getpid()}"
    written: list[tuple[Path, Path]] = []
    try:
        for write in writes:
            final = target_dir / write.relative
            partial = final.with_name(final.name + suffix)
            written.append((partial, final))
            if write.api_version is None:
                write.data._filename = write.relative + suffix
                try:
                    write.data.save(str(target_dir))
                finally:
                    write.data._filename = write.relative
            else:
                util.write_json(str(partial), write.data, write.api_version)
    except OSError as error:
        for partial, _ in written:
            partial.unlink(missing_ok=True)
        raise RunnerError(f"cannot write into {target_dir}: {one_line(error)}; it is unchanged") from error
    for partial, final in written:
        os.replace(partial, final)


def save_atomically(results: Any, results_dir: str | os.PathLike[str], relative: str) -> None:
    """Save asv ``Results`` as ``results_dir/relative``, replacing any file there by an atomic rename."""
    _write_all([_Write(relative, results)], Path(results_dir))

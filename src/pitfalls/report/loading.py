"""asv's results folder -> rows, read with asv's own loader; what cannot be read is left out and named (docs/report.md).
"""

from __future__ import annotations

import ast
import datetime as dt
import itertools
import logging
import math
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asv import results as asv_results

from pitfalls import asv_files
from pitfalls.report.rows import FAILED, OK, SKIPPED, Row

__all__ = ["ASV_KINDS", "LoadedResults", "StandIn", "Unreadable", "file_rows", "read_results", "torch_version"]

log = logging.getLogger(__name__)

# asv's benchmark types (benchmarks.json "type") -> the method-name prefix the report calls them by.
ASV_KINDS = {"time": "time", "peakmemory": "peakmem", "memory": "mem", "track": "track"}
# A torch version inside an asv environment name: asv names a matrix environment "virtualenv-py3.11-torch2.13.0".
_TORCH_IN_NAME = re.compile(r"(?:^|[-_])torch[-_]?(\d+(?:\.\d+)*[A-Za-z0-9.+]*)")


@dataclass(frozen=True)
class Unreadable:
    """A results file, or one benchmark in one, that the report could not read and left out.

    Attributes:
        path: the file, relative to the results folder ("<machine>/<commit>-<env>.json").
        benchmark: the benchmark whose figures were left out; None when the whole file was.
        reason: what is wrong with it.
    """

    path: str
    benchmark: str | None
    reason: str

    def __str__(self) -> str:
        what = f"benchmark {self.benchmark}" if self.benchmark else "the whole file"
        return f"{self.path}: {what} left out: {self.reason}"


@dataclass(frozen=True)
class StandIn:
    """An environment whose newest results file could not be read: an older commit is shown in its place.

    Attributes:
        machine: asv machine name.
        env: asv environment name.
        shown_commit: the commit shown for the environment (its newest readable results).
        path: the unreadable file, relative to the results folder.
        unreadable_commit: the commit the unreadable file names (from its first bytes or its name), if any.
        certain: True when the unreadable file's commit date is known to be newer; False when it is unknown.
    """

    machine: str
    env: str
    shown_commit: str
    path: str
    unreadable_commit: str | None
    certain: bool

    def __str__(self) -> str:
        commit = f"commit {self.unreadable_commit[:8]}" if self.unreadable_commit else "an unknown commit"
        if self.certain:
            return (
                f"{self.machine}, environment {self.env}: shows commit {self.shown_commit[:8]} in place of the newer "
                f"{commit}, whose file {self.path} could not be read"
            )
        return (
            f"{self.machine}, environment {self.env}: shows commit {self.shown_commit[:8]}; {self.path} ({commit}) "
            "could not be read and may hold newer results"
        )


@dataclass(frozen=True)
class LoadedResults:
    """Everything the report is made of.

    Attributes:
        rows: one per (machine, commit, environment, benchmark, parameter combination) shown.
        compared: the rows of the commits compared across environments (torch versions); may share rows with
            ``rows``.
        unreadable: files and benchmarks left out, with the reason.
        stand_ins: environments shown at an older commit because their newest file could not be read.
        also_compared: (machine, commit) of other commits measured in two or more environments, not compared here.
        notes: other facts the reader should know (e.g. no benchmarks.json).
    """

    rows: tuple[Row, ...]
    compared: tuple[Row, ...] = ()
    unreadable: tuple[Unreadable, ...] = ()
    stand_ins: tuple[StandIn, ...] = ()
    also_compared: tuple[tuple[str, str], ...] = ()
    notes: tuple[str, ...] = ()


class _Malformed(ValueError):
    """One benchmark of a results file holds something the report cannot read."""


def _ms_to_datetime(value: Any) -> dt.datetime | None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        return None
    return dt.datetime.fromtimestamp(value / 1000, tz=dt.timezone.utc)


def _param_value(text: Any) -> Any:
    """asv stores parameter values as their repr; turn "'naive'" back into "naive" and "1000" into 1000."""
    if not isinstance(text, str):
        raise _Malformed(f"parameter value {text!r} is not asv's text form of a value")
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        # Not a literal (a class, a function...): keep asv's own display form.
        return asv_results._format_param_value(text)


def torch_version(params: Any, requirements: Any, env_name: Any) -> tuple[str | None, str | None]:
    """The torch version of a run, from what asv recorded, and where it was found.

    Args:
        params: the results file's ``params`` (machine facts plus the matrix entries, e.g. ``torch``).
        requirements: the results file's ``requirements`` (the environment's pinned packages).
        env_name: asv's environment name (``virtualenv-py3.11-torch2.13.0``).

    Returns:
        (version, source) with source "asv params", "asv requirements" or "environment name"; (None, None) when
        none of them names a version.
    """
    for source, mapping in (("asv params", params), ("asv requirements", requirements)):
        value = mapping.get("torch") if isinstance(mapping, Mapping) else None
        if isinstance(value, str) and value.strip(" =v"):
            return value.strip(" =v"), source
    match = _TORCH_IN_NAME.search(env_name) if isinstance(env_name, str) else None
    if match:
        return match.group(1), "environment name"
    return None, None


def _benchmark_meta(root: Path, unreadable: list[Unreadable], notes: list[str]) -> dict[str, dict[str, Any]]:
    """benchmarks.json (names, param names, units), read by asv; empty when absent or unreadable."""
    path = root / asv_files.BENCHMARKS
    if not path.is_file():
        notes.append(
            "No benchmarks.json in the results folder: parameter names are asv's defaults (param1, param2, ...) and "
            "units come from the benchmark names."
        )
        return {}
    try:
        data = asv_files.read_json(path, asv_files.SUITE_API)
    except asv_files.Unreadable as error:
        unreadable.append(Unreadable(asv_files.BENCHMARKS, None,
                                     f"{error.reason}; parameter names and units come from the results files"))
        return {}
    return {name: meta for name, meta in data.items() if isinstance(meta, dict)}


def _kind_and_unit(name: str, meta: Mapping[str, Any] | None) -> tuple[str, str]:
    """The benchmark's kind ("time", "peakmem", "mem", "track") and unit, from benchmarks.json or its name."""
    kind = ASV_KINDS.get(str((meta or {}).get("type")))
    if kind is None:
        method = name.rsplit(".", 1)[-1]
        kind = next((k for k in ("time", "timeraw", "peakmem", "mem") if method.startswith(k + "_")), "track")
        kind = "time" if kind == "timeraw" else kind
    unit = (meta or {}).get("unit") or {"time": "seconds", "peakmem": "bytes", "mem": "bytes"}.get(kind, "")
    return kind, str(unit)


def _age(result: Any) -> tuple[float, float]:
    """How recent a result is: by commit date, then by when its run started."""
    started = [v for v in result.started_at.values() if isinstance(v, (int, float))]
    date = result.date if isinstance(result.date, (int, float)) else 0
    return (date, max(started, default=0))


def _oldest_first(results: Iterable[Any]) -> list[Any]:
    return sorted(results, key=lambda r: (_age(r), r.env_name))


def _newest_per_env(loaded: list[Any]) -> list[Any]:
    """Of each environment's results files keep the newest commit (the first of equally new ones)."""
    newest: dict[str, Any] = {}
    for result in sorted(loaded, key=_age, reverse=True):
        newest.setdefault(result.env_name, result)
    return list(newest.values())


def _status(value: Any, combo: tuple[Any, ...]) -> tuple[str, float | None]:
    if value is None:
        return FAILED, None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        where = f" for parameters ({', '.join(combo)})" if combo else ""
        raise _Malformed(f"value {value!r}{where} is not a number (nor null for a failure, NaN for a skip)")
    if math.isnan(value):
        return SKIPPED, None
    return OK, float(value)


def _benchmark_rows(result: Any, name: str, meta: Mapping[str, Any] | None, base: dict[str, Any]) -> list[Row]:
    """The rows of one benchmark of one results file; _Malformed when it holds something else than figures."""
    kind, unit = _kind_and_unit(name, meta)
    params = result.get_result_params(name) or []
    if not isinstance(params, list) or not all(isinstance(p, list) for p in params):
        raise _Malformed(f"parameters {params!r} are not lists of values")
    names = list(meta["param_names"]) if meta and meta.get("param_names") else []
    # A result whose parameters are not the ones benchmarks.json describes (a benchmark that has gained or lost an
    # axis since) cannot be named by them: it is one of the "other benchmarks", under asv's own default names.
    described = meta is not None and len(names) == len(params)
    if not described:
        names = [f"param{i + 1}" for i in range(len(params))]
    combos = list(itertools.product(*params))
    # asv's accessor pads a short list with nulls, which would read as failures: check the stored list itself.
    stored = result._results.get(name)
    if stored is not None and (not isinstance(stored, list) or len(stored) != len(combos)):
        count = len(stored) if isinstance(stored, list) else type(stored).__name__
        raise _Malformed(f"{count} values for {len(combos)} parameter combinations")
    values = result.get_result_value(name, params)
    started = result.started_at.get(name)
    rows = []
    for combo, value in zip(combos, values, strict=True):
        status, number = _status(value, combo)
        rows.append(
            Row(
                **base,
                measured_at=_ms_to_datetime(started),
                family=name.split(".", 1)[0].removeprefix("bench_"),
                benchmark=name,
                kind=kind,
                unit=unit,
                params={n: _param_value(v) for n, v in zip(names, combo, strict=True)},
                value=number,
                status=status,
                in_suite=described,
            )
        )
    return rows


def _rows_of(
    result: Any, machine: str, meta: Mapping[str, dict[str, Any]], facts: dict[str, Any], path: str
) -> tuple[list[Row], list[Unreadable]]:
    torch, torch_from = torch_version(result.params, result._requirements, result.env_name)
    base = {
        "machine": machine,
        "commit": result.commit_hash,
        "commit_date": _ms_to_datetime(result.date),
        "env": result.env_name,
        "torch": torch,
        "torch_from": torch_from,
        "machine_facts": facts,
    }
    rows: list[Row] = []
    unreadable: list[Unreadable] = []
    for name in sorted(result.get_all_result_keys()):
        try:
            rows.extend(_benchmark_rows(result, name, meta.get(name), base))
        except _Malformed as error:
            unreadable.append(Unreadable(path, name, str(error)))
    return rows, unreadable


def _stand_ins(
    machine: str, broken: list[tuple[str, dict[str, Any]]], shown: dict[str, Any]
) -> list[StandIn]:
    """Environments shown at an older commit because a newer (or undated) file of theirs could not be read."""
    found = []
    for path, header in broken:
        result = shown.get(header["env"])
        if result is None or (header["commit"] and result.commit_hash.startswith(header["commit"])):
            continue
        if header["date"] is not None and header["date"] < _age(result)[0]:
            continue  # an older file: nothing newer is hidden
        certain = header["date"] is not None
        found.append(StandIn(machine, result.env_name, result.commit_hash, path, header["commit"], certain))
    return found


def _label(result: Any) -> str:
    """What tells environments apart in a comparison: the torch version, else the environment name."""
    torch, _ = torch_version(result.params, result._requirements, result.env_name)
    return f"torch {torch}" if torch else result.env_name


def _compared_commit(loaded: list[Any]) -> tuple[str | None, list[str]]:
    """The newest commit measured in two or more environments, and the other such commits (newest first)."""
    by_commit: dict[str, list[Any]] = {}
    for result in loaded:
        by_commit.setdefault(result.commit_hash, []).append(result)
    several = [c for c, results in by_commit.items() if len({_label(r) for r in results}) >= 2]
    several.sort(key=lambda c: max(_age(r) for r in by_commit[c]), reverse=True)
    return (several[0] if several else None), several[1:]


def _read_machine(
    root: Path, name: str, meta: Mapping[str, dict[str, Any]], commit: str | None
) -> tuple[LoadedResults, set[str]]:
    """One machine's part of `read_results`, and the commits it has readable results for."""
    try:
        facts = asv_files.read_json(root / name / asv_files.MACHINE, asv_files.MACHINE_API)
    except asv_files.Unreadable:
        facts = {"machine": name}
    loaded, broken, unreadable = [], [], []
    for relative in asv_files.result_files(root, name):
        try:
            loaded.append((relative, asv_files.load(root / relative, str(facts.get("machine") or name))))
        except asv_files.Unreadable as error:
            unreadable.append(Unreadable(relative, None, error.reason))
            broken.append((relative, asv_files.header(root / relative)))
    paths = {id(r): p for p, r in loaded}
    results = [r for _, r in loaded]
    stand_ins: list[StandIn] = []
    others: list[str] = []
    if commit is not None:
        selected = [r for r in results if r.commit_hash.startswith(commit.strip())]
        to_compare = selected
    else:
        selected = _newest_per_env(results)
        stand_ins = _stand_ins(name, broken, {r.env_name: r for r in selected})
        compared_commit, others = _compared_commit(results)
        to_compare = [r for r in results if r.commit_hash == compared_commit]
    built: dict[int, list[Row]] = {}
    for result in _oldest_first({id(r): r for r in selected + to_compare}.values()):
        built[id(result)], bad = _rows_of(result, name, meta, facts, paths[id(result)])
        unreadable += bad
    part = LoadedResults(
        rows=tuple(row for result in _oldest_first(selected) for row in built[id(result)]),
        compared=tuple(row for result in _oldest_first(to_compare) for row in built[id(result)]),
        unreadable=tuple(unreadable),
        stand_ins=tuple(stand_ins),
        also_compared=tuple((name, c) for c in others),
    )
    return part, {r.commit_hash for r in results}


def read_results(
    results_dir: str | os.PathLike[str], machine: str | None = None, commit: str | None = None
) -> LoadedResults:
    """Read asv results into rows, naming what could not be read, and pick the commit to compare across torch.

    Args:
        results_dir: asv's results folder (holds ``<machine>/machine.json``, ``<machine>/<commit>-<env>.json``
            and ``benchmarks.json``).
        machine: only this machine; None means every machine with results.
        commit: only this commit (a hash or unique prefix), compared across its environments; None means each
            environment's newest commit, and the newest commit measured in two or more environments compared.

    Returns:
        The rows, in machine, then results-file (oldest first), then benchmark, then parameter order; the rows
        compared across environments; what was left out and why.

    Raises:
        ValueError: the folder does not exist or holds no readable results, the machine or commit has none (the
            message lists what there is).
    """
    if not isinstance(results_dir, (str, os.PathLike)):
        raise TypeError(f"results_dir must be a path, got {results_dir!r} ({type(results_dir).__name__})")
    root = Path(results_dir)
    if not root.is_dir():
        raise ValueError(f"results_dir={str(root)!r} is not a folder; expected asv's results folder (results/)")
    machines = asv_files.machines(root)
    if not machines:
        raise ValueError(
            f"results_dir={str(root)!r} holds no asv results (no <machine>/machine.json); run the suite first "
            "(scripts/run-suite or asv run)"
        )
    if machine is not None and machine not in machines:
        raise ValueError(f"machine={machine!r} has no results in {str(root)!r}; known machines: {', '.join(machines)}")
    if commit is not None and (not isinstance(commit, str) or not commit.strip()):
        raise ValueError(f"commit={commit!r} is not a commit hash or prefix")
    unreadable: list[Unreadable] = []
    notes: list[str] = []
    meta = _benchmark_meta(root, unreadable, notes)
    parts = [_read_machine(root, name, meta, commit) for name in ([machine] if machine is not None else machines)]
    rows = [row for part, _ in parts for row in part.rows]
    unreadable += [problem for part, _ in parts for problem in part.unreadable]
    stand_ins = [stand_in for part, _ in parts for stand_in in part.stand_ins]
    for problem in [*unreadable, *stand_ins]:
        log.warning("pitfalls report: %s", problem)
    if not rows:
        where = f"machine {machine!r} in {str(root)!r}" if machine else repr(str(root))
        left_out = "; ".join(str(u) for u in unreadable)
        left_out = f"; left out: {left_out}" if left_out else ""
        if commit is not None:
            known = ", ".join(sorted({c[:8] for _, commits in parts for c in commits})) or "none"
            raise ValueError(f"commit={commit!r} has no results for {where}; commits with results: {known}{left_out}")
        raise ValueError(f"{where} holds no readable asv results files (<machine>/<commit>-<env>.json){left_out}")
    return LoadedResults(
        rows=tuple(rows),
        compared=tuple(row for part, _ in parts for row in part.compared),
        unreadable=tuple(unreadable),
        stand_ins=tuple(stand_ins),
        also_compared=tuple(also for part, _ in parts for also in part.also_compared),
        notes=tuple(notes),
    )


def file_rows(results_file: Path) -> list[Row]:
    """The rows of one asv results file, ``<results>/<machine>/<commit>-<env>.json``.

    Raises:
        ValueError: the path is not such a file.
    """
    if results_file.suffix != ".json" or "-" not in results_file.stem or not results_file.is_file():
        raise ValueError(f"{str(results_file)!r} is not an asv results file (<results>/<machine>/<commit>-<env>.json)")
    commit, env = results_file.stem.split("-", 1)
    loaded = read_results(results_file.parent.parent, machine=results_file.parent.name, commit=commit)
    return [row for row in loaded.rows if row.env == env]

"""asv results -> a summary table (markdown) and charts (PNG): what `pitfalls report` writes.

Results are read through asv's own loader (`asv.results`), so the report sees exactly what asv's site sees. asv
stores a benchmark that was skipped (NotImplementedError in setup, SkipNotImplemented in the method) as NaN and
one that failed as null; both become ``value=None`` here, told apart by ``status``, and are shown as "n/a" and
"failed", never as a number. asv does not keep the reason of a skip in its results files; ``asv run
--show-stderr`` prints it, and the report says so.
"""

from __future__ import annotations

import ast
import datetime as dt
import itertools
import math
import os
import tempfile
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from asv import results as asv_results
from asv import util as asv_util
from asv.machine import Machine

__all__ = [
    "Row",
    "charts",
    "comparison_markdown",
    "env_label",
    "format_value",
    "load_results",
    "summary_markdown",
    "write_report",
]

OK, SKIPPED, FAILED = "ok", "skipped", "failed"

# Column order of the summary tables and their headings; a figure not listed here comes after these, headed by its
# own name. Keys are benchmark method names with the leading "time_"/"peakmem_" folded into the kind.
_FIGURES: dict[str, str] = {
    "time": "time per call",
    "track_speedup": "speedup over {baseline}",
    "track_sync_hazards": "sync hazards",
    "track_cuda_syncs": "CUDA syncs",
    "track_gpu_busy": "GPU busy",
    "peakmem": "peak host memory",
    "track_cuda_peak_memory": "CUDA peak memory",
    "track_gpu_memory": "GPU memory used",
    "track_gpu_power": "GPU power",
    "track_compile_seconds": "compile time",
    "track_graph_breaks": "graph breaks",
    "track_recompiles": "recompiles",
}
# asv's benchmark types (benchmarks.json "type") -> the method-name prefix the report calls them by.
_ASV_TYPES = {"time": "time", "peakmemory": "peakmem", "memory": "mem", "track": "track"}

NA_NOTE = (
    "**n/a**: skipped by the benchmark, because the figure cannot be measured on that machine (no GPU, no NVML, "
    "too big for memory, ...); `asv run --show-stderr` prints each reason. **failed**: the benchmark raised an "
    "error. Neither is ever shown as a number."
)


@dataclass(frozen=True)
class Row:
    """One figure of one benchmark case, as asv recorded it.

    Attributes:
        machine: asv machine name (the folder under the results directory).
        commit: full commit hash the figure was measured at.
        commit_date: when that commit was made (UTC), as asv records it.
        measured_at: when asv started this benchmark (UTC); None if the results file does not say.
        env: asv environment name (one per torch version in a matrix run).
        torch: torch version of the environment when the results file records it (asv's params or requirements,
            as in a matrix run); None otherwise (``asv run --python=same`` records none by itself).
        family: benchmark module without its ``bench_`` prefix ("loss", "sampler").
        benchmark: full asv benchmark name, e.g. "bench_loss.Step.time_step".
        kind: "time", "peakmem", "mem" or "track" (asv's benchmark types).
        unit: the benchmark's unit ("seconds", "bytes", or a track_'s own unit such as "x").
        params: parameter name -> value for this case, in the benchmark's order.
        value: the figure, or None when the case was skipped or failed.
        status: "ok", "skipped" or "failed".
        machine_facts: asv's machine.json for the machine (cpu, num_cpu, arch, os, ram).
    """

    machine: str
    commit: str
    commit_date: dt.datetime | None
    measured_at: dt.datetime | None
    env: str
    torch: str | None
    family: str
    benchmark: str
    kind: str
    unit: str
    params: dict[str, Any] = field(hash=False)
    value: float | None
    status: str
    machine_facts: dict[str, Any] = field(default_factory=dict, hash=False, compare=False, repr=False)

    @property
    def figure(self) -> str:
        """The method name, e.g. "time_step" or "track_speedup"."""
        return self.benchmark.rsplit(".", 1)[-1]

    @property
    def figure_key(self) -> str:
        """What the summary groups columns by: the kind for time_/peakmem_, the method name for track_."""
        return self.figure if self.kind == "track" else self.kind

    @property
    def case(self) -> tuple[tuple[str, Any], ...]:
        """The parameters as a hashable tuple of (name, value)."""
        return tuple(self.params.items())


# --------------------------------------------------------------------------------------------------- loading


def _ms_to_datetime(value: Any) -> dt.datetime | None:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    return dt.datetime.fromtimestamp(value / 1000, tz=dt.timezone.utc)


def _param_value(text: str) -> Any:
    """asv stores parameter values as their repr; turn "'naive'" back into "naive" and "1000" into 1000."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        # Not a literal (a class, a function...): keep asv's own display form.
        return asv_results._format_param_value(text)


def _known_machines(root: Path) -> list[str]:
    return sorted(p.parent.name for p in root.glob("*/machine.json"))


def _benchmark_meta(root: Path) -> dict[str, dict[str, Any]]:
    """benchmarks.json (names, param names, units), read by asv; empty when absent (units then come from names)."""
    path = root / "benchmarks.json"
    if not path.is_file():
        return {}
    try:
        data = asv_util.load_json(str(path), api_version=2)
    except asv_util.UserError as error:
        raise ValueError(f"results_dir={str(root)!r}: cannot read {path}: {error}") from error
    return {name: meta for name, meta in data.items() if isinstance(meta, dict)}


def _machine_facts(root: Path, machine: str) -> dict[str, Any]:
    try:
        return dict(asv_util.load_json(str(root / machine / "machine.json"), api_version=Machine.api_version))
    except (asv_util.UserError, OSError):
        return {"machine": machine}


def _kind_and_unit(name: str, meta: Mapping[str, Any] | None) -> tuple[str, str]:
    """The benchmark's kind ("time", "peakmem", "mem", "track") and unit, from benchmarks.json or its name."""
    kind = _ASV_TYPES.get(str((meta or {}).get("type")))
    if kind is None:
        method = name.rsplit(".", 1)[-1]
        kind = next((k for k in ("time", "timeraw", "peakmem", "mem") if method.startswith(k + "_")), "track")
        kind = "time" if kind == "timeraw" else kind
    unit = (meta or {}).get("unit") or {"time": "seconds", "peakmem": "bytes", "mem": "bytes"}.get(kind, "")
    return kind, str(unit)


def _newest_per_env(loaded: list[Any]) -> list[Any]:
    """Of each environment's results files keep the newest commit (by commit date, then by run time)."""

    def age(result: Any) -> tuple[float, float]:
        started = [v for v in result.started_at.values() if isinstance(v, (int, float))]
        return (result.date or 0, max(started, default=0))

    newest: dict[str, Any] = {}
    for result in loaded:
        kept = newest.get(result.env_name)
        if kept is None or age(result) > age(kept):
            newest[result.env_name] = result
    return list(newest.values())


def _rows_of(result: Any, machine: str, meta: Mapping[str, Mapping[str, Any]], facts: dict[str, Any]) -> list[Row]:
    torch_version = result.params.get("torch") or (result._requirements or {}).get("torch")
    rows = []
    for name in sorted(result.get_all_result_keys()):
        benchmark = meta.get(name)
        kind, unit = _kind_and_unit(name, benchmark)
        params = result.get_result_params(name) or []
        names = list(benchmark["param_names"]) if benchmark and benchmark.get("param_names") else []
        if len(names) != len(params):
            names = [f"param{i + 1}" for i in range(len(params))]  # asv's own default naming
        values = result.get_result_value(name, params)
        started = result.started_at.get(name)
        for combo, value in zip(itertools.product(*params), values):
            if value is None:
                status, number = FAILED, None
            elif isinstance(value, (int, float)) and math.isnan(value):
                status, number = SKIPPED, None
            else:
                status, number = OK, float(value)
            rows.append(
                Row(
                    machine=machine,
                    commit=result.commit_hash,
                    commit_date=_ms_to_datetime(result.date),
                    measured_at=_ms_to_datetime(started),
                    env=result.env_name,
                    torch=str(torch_version) if torch_version else None,
                    family=name.split(".", 1)[0].removeprefix("bench_"),
                    benchmark=name,
                    kind=kind,
                    unit=unit,
                    params={n: _param_value(v) for n, v in zip(names, combo)},
                    value=number,
                    status=status,
                    machine_facts=facts,
                )
            )
    return rows


def load_results(
    results_dir: str | os.PathLike[str], machine: str | None = None, commit: str | None = None
) -> list[Row]:
    """Read asv results into one row per (machine, commit, environment, benchmark, parameter combination).

    Args:
        results_dir: asv's results folder (holds ``<machine>/machine.json``, ``<machine>/<commit>-<env>.json``
            and ``benchmarks.json``).
        machine: only this machine; None means every machine with results.
        commit: only this commit (a hash or unique prefix); None means each environment's newest commit.

    Returns:
        The rows, in results-file then benchmark then parameter order.

    Raises:
        ValueError: the folder does not exist or holds no results, the machine or commit has none (the message
            lists what there is).
    """
    if not isinstance(results_dir, (str, os.PathLike)):
        raise TypeError(f"results_dir must be a path, got {results_dir!r} ({type(results_dir).__name__})")
    root = Path(results_dir)
    if not root.is_dir():
        raise ValueError(f"results_dir={str(root)!r} is not a folder; expected asv's results folder (results/)")
    machines = _known_machines(root)
    if not machines:
        raise ValueError(
            f"results_dir={str(root)!r} holds no asv results (no <machine>/machine.json); run the suite first "
            "(scripts/run-suite or asv run)"
        )
    if machine is not None and machine not in machines:
        raise ValueError(f"machine={machine!r} has no results in {str(root)!r}; known machines: {', '.join(machines)}")
    if commit is not None and (not isinstance(commit, str) or not commit.strip()):
        raise ValueError(f"commit={commit!r} is not a commit hash or prefix")
    meta = _benchmark_meta(root)
    rows: list[Row] = []
    seen_commits: set[str] = set()
    for name in [machine] if machine is not None else machines:
        loaded = list(asv_results.iter_results_for_machine(str(root), name))
        seen_commits.update(r.commit_hash for r in loaded)
        if commit is not None:
            loaded = [r for r in loaded if r.commit_hash.startswith(commit.strip())]
        else:
            loaded = _newest_per_env(loaded)
        facts = _machine_facts(root, name)
        for result in sorted(loaded, key=lambda r: (r.date or 0, r.env_name)):
            rows.extend(_rows_of(result, name, meta, facts))
    if not rows:
        where = f"machine {machine!r} in {str(root)!r}" if machine else repr(str(root))
        if commit is not None:
            known = ", ".join(sorted(c[:8] for c in seen_commits)) or "none"
            raise ValueError(f"commit={commit!r} has no results for {where}; commits with results: {known}")
        raise ValueError(f"{where} holds no readable asv results files (<machine>/<commit>-<env>.json)")
    return rows


# ------------------------------------------------------------------------------------------------ formatting


def _version_key(text: str) -> tuple[Any, ...]:
    parts = []
    for piece in text.replace("+", ".").split("."):
        parts.append((0, int(piece), "") if piece.isdigit() else (1, 0, piece))
    return tuple(parts)


def env_label(row: Row) -> str:
    """How a row's environment is named in headings: its torch version when known, else asv's env name."""
    return f"torch {row.torch}" if row.torch else f"env {row.env}"


def _env_order(row: Row) -> tuple[Any, ...]:
    return (0, _version_key(row.torch), row.env) if row.torch else (1, (), row.env)


def format_value(value: float | None, unit: str, status: str = OK) -> str:
    """Format one figure for a table: adaptive time and byte units (asv's own), 3 significant digits otherwise.

    Args:
        value: the figure, or None.
        unit: the row's unit ("seconds", "bytes", "x", "%", ...).
        status: the row's status; "skipped" shows "n/a", "failed" shows "failed".

    Returns:
        The cell text.
    """
    if status == SKIPPED or (value is None and status == OK):
        return "n/a"
    if status == FAILED or value is None:
        return "failed"
    if not math.isfinite(value):
        return str(value)
    if unit in ("seconds", "bytes"):
        return asv_util.human_value(value, unit)
    number = f"{value:.3g}" if value != int(value) or abs(value) >= 1e6 else f"{int(value)}"
    if unit == "x":
        return f"{number}x"
    if unit == "%":
        return f"{number} %"
    return number


def _figure_heading(key: str, rows: Sequence[Row], baseline: str) -> str:
    label = _FIGURES.get(key)
    if label is None:
        label = key.split("_", 1)[-1].replace("_", " ")
    label = label.format(baseline=baseline)
    unit = rows[0].unit
    # Units that every cell already shows (adaptive time and bytes, "2.5x", "87 %") stay out of the heading.
    if key in ("time", "peakmem", "mem") or unit in ("", "seconds", "bytes", "x", "%"):
        return label
    return f"{label} ({unit})"


def _figure_order(key: str) -> tuple[int, str]:
    order = list(_FIGURES)
    return (order.index(key), key) if key in order else (len(order), key)


def _md_cell(value: Any) -> str:
    return str(value).replace("|", "\\|")


def _md_table(header: Sequence[str], body: Iterable[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(_md_cell(h) for h in header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(_md_cell(c) for c in line) + " |" for line in body]
    return lines


def _date(value: dt.datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M UTC") if value else "unknown"


def _param_heading(names: Sequence[str]) -> str:
    return ", ".join(n.replace("_", " ") for n in names)


def _ordered_names(names: Iterable[str]) -> list[str]:
    names = list(names)
    return (["variant"] if "variant" in names else []) + [n for n in names if n != "variant"]


def baseline_variant(rows: Iterable[Row]) -> str:
    """The family's reference variant: the first ``variant`` value in asv's parameter order ("naive")."""
    for row in rows:
        if "variant" in row.params:
            return str(row.params["variant"])
    return "baseline"


def _dead_slices(all_na: Sequence[Mapping[str, Any]], cases: Sequence[Mapping[str, Any]]) -> list[tuple[str, Any]]:
    """Parameter values (such as device=cuda) for which every case, and more than one, is n/a in every column.

    A table then says "n/a for every case with device=cuda" once instead of repeating such lines; other n/a cases
    stay in the table.
    """
    dead = []
    for name in cases[0] if cases else ():
        for value in dict.fromkeys(c[name] for c in cases):
            having = [c for c in cases if c[name] == value]
            if len(having) > 1 and len(having) < len(cases) and all(c in all_na for c in having):
                dead.append((name, value))
    return dead


def _family_tables(rows: Sequence[Row]) -> list[str]:
    """The tables of one family in one environment: one per parameter set (asv class shape)."""
    baseline = baseline_variant(rows)
    by_shape: dict[tuple[str, ...], list[Row]] = defaultdict(list)
    for row in rows:
        by_shape[tuple(row.params)].append(row)
    lines: list[str] = []
    for shape in sorted(by_shape, key=lambda s: -len(s)):
        shape_rows = by_shape[shape]
        names = _ordered_names(shape)
        figures: dict[str, list[Row]] = defaultdict(list)
        cells: dict[tuple[Any, ...], dict[str, Row]] = defaultdict(dict)
        for row in shape_rows:
            figures[row.figure].append(row)
            cells[tuple(row.params[n] for n in names)][row.figure] = row
        keys = sorted(figures, key=lambda f: (_figure_order(figures[f][0].figure_key), f))
        headings = [_figure_heading(figures[k][0].figure_key, figures[k], baseline) for k in keys]
        if len(set(headings)) < len(headings):  # e.g. two time_ methods in one class: name them
            headings = [f"{h} ({k})" if headings.count(h) > 1 else h for h, k in zip(headings, keys)]
        cases = [dict(zip(names, case)) for case in cells]
        all_na = [
            dict(zip(names, case))
            for case, by_key in cells.items()
            if all(by_key.get(k) is None or by_key[k].status == SKIPPED for k in keys)
        ]
        dead = [] if len(all_na) == len(cases) else _dead_slices(all_na, cases)
        body = []
        for case, by_key in cells.items():
            if any(dict(zip(names, case))[n] == v for n, v in dead):
                continue
            shown = [by_key.get(k) for k in keys]
            # A blank cell: this figure has no benchmark for this case (not a skip).
            texts = [format_value(r.value, r.unit, r.status) if r else "" for r in shown]
            body.append([str(v) for v in case] + texts)
        lines += [f"#### {rows[0].family}: per {_param_heading(names)}", ""]
        figures_text = ", ".join(headings)
        if len(all_na) == len(cases):
            lines += [f"{figures_text}: n/a (skipped) for every case ({len(cases)} cases).", ""]
            continue
        lines += _md_table(list(names) + headings, body)
        lines.append("")
        for name, value in dead:
            count = sum(1 for c in cases if c[name] == value)
            lines += [f"{figures_text}: n/a (skipped) for every case with {name}={value} ({count} cases).", ""]
    return lines


def _group(rows: Iterable[Row], key: Callable[[Row], Any]) -> dict[Any, list[Row]]:
    grouped: dict[Any, list[Row]] = defaultdict(list)
    for row in rows:
        grouped[key(row)].append(row)
    return grouped


def _machine_line(facts: Mapping[str, Any]) -> str:
    parts = []
    if facts.get("cpu"):
        parts.append(str(facts["cpu"]))
    if facts.get("num_cpu"):
        parts.append(f"{facts['num_cpu']} CPUs")
    if facts.get("arch"):
        parts.append(str(facts["arch"]))
    if facts.get("os"):
        parts.append(str(facts["os"]))
    ram = facts.get("ram")
    if isinstance(ram, str) and ram.isdigit():
        parts.append(f"{int(ram) / 2**30:.1f} GiB RAM")
    return " · ".join(parts) if parts else "no machine facts recorded"


def comparison_markdown(rows: Sequence[Row]) -> str:
    """Tables comparing the time per call of environments (torch versions) measured at one commit.

    Args:
        rows: rows of one or more machines; only commits measured in two or more environments are compared.

    Returns:
        Markdown, empty when no commit has two environments.
    """
    lines: list[str] = []
    for (machine, commit), group in _group(rows, lambda r: (r.machine, r.commit)).items():
        envs = sorted({(_env_order(r), r.env): r for r in group}.values(), key=_env_order)
        if len(envs) < 2:
            continue
        labels = [env_label(e) for e in envs]
        lines += [f"### {machine}: {' vs '.join(labels)} at commit {commit[:8]}", ""]
        lines.append(
            f"Time per call in each environment; the last column is {labels[-1]} / {labels[0]} (below 1: faster there)."
        )
        lines.append("")
        times = [r for r in group if r.kind == "time"]
        for (family, benchmark), bench_rows in _group(times, lambda r: (r.family, r.benchmark)).items():
            names = _ordered_names(bench_rows[0].params)
            table: dict[tuple[Any, ...], dict[str, Row]] = defaultdict(dict)
            for row in bench_rows:
                table[tuple(row.params[n] for n in names)][row.env] = row
            cases = [dict(zip(names, case)) for case in table]
            all_na = [
                dict(zip(names, case))
                for case, by_env in table.items()
                if all(by_env.get(e.env) is None or by_env[e.env].status == SKIPPED for e in envs)
            ]
            dead = _dead_slices(all_na, cases)
            body = []
            for case, by_env in table.items():
                if any(dict(zip(names, case))[n] == v for n, v in dead):
                    continue
                cells = [by_env.get(e.env) for e in envs]
                texts = [format_value(c.value, c.unit, c.status) if c else "not run" for c in cells]
                a, b = cells[0], cells[-1]
                if a and b and a.value and b.value is not None:
                    ratio = f"{b.value / a.value:.2f}"
                else:
                    ratio = "n/a"
                body.append([str(v) for v in case] + texts + [ratio])
            lines += [f"#### {family}: {benchmark.rsplit('.', 1)[-1]}", ""]
            lines += _md_table(names + [f"time, {label}" for label in labels] + ["ratio"], body)
            lines.append("")
            for name, value in dead:
                count = sum(1 for c in cases if c[name] == value)
                lines += [f"n/a (skipped) in every environment for every case with {name}={value} ({count} cases).", ""]
    return "\n".join(lines)


def summary_markdown(
    rows: Sequence[Row], charts_by_family: Mapping[tuple[str, str, str, str], Sequence[str]] | None = None
) -> str:
    """The report as markdown: per machine and environment a header, then per family its tables.

    Args:
        rows: rows from `load_results`.
        charts_by_family: optional (machine, env, commit, family) -> image paths (relative to the markdown file)
            to link under the family's tables.

    Returns:
        The markdown text.
    """
    rows = _checked_rows(rows)
    lines = ["# pitfalls: benchmark report", "", NA_NOTE, ""]
    for machine, machine_rows in sorted(_group(rows, lambda r: r.machine).items()):
        lines += [f"## Machine `{machine}`", "", _machine_line(machine_rows[0].machine_facts), ""]
        envs = _group(machine_rows, lambda r: (r.env, r.commit))
        for (env, commit), env_rows in sorted(envs.items(), key=lambda item: _env_order(item[1][0])):
            first = env_rows[0]
            measured = [r.measured_at for r in env_rows if r.measured_at]
            torch_text = (
                first.torch or "not recorded by asv (an environment outside asv's torch matrix, e.g. --python=same)"
            )
            lines += [
                f"### {env_label(first)}, commit {commit[:8]}",
                "",
                f"- machine: `{machine}`",
                f"- commit: `{commit}` (committed {_date(first.commit_date)})",
                f"- torch: {torch_text}",
                f"- asv environment: `{env}`",
                f"- measured: {_date(max(measured) if measured else None)}",
                "",
            ]
            for family, family_rows in _group(env_rows, lambda r: r.family).items():
                lines += _family_tables(family_rows)
                for image in (charts_by_family or {}).get((machine, env, commit, family), ()):
                    lines += [f"![{family}: {Path(image).stem}]({image})", ""]
    comparison = comparison_markdown(rows)
    if comparison:
        lines += ["## Across torch versions", "", comparison]
    return "\n".join(lines).rstrip() + "\n"


def _checked_rows(rows: Any) -> list[Row]:
    if isinstance(rows, (str, bytes)) or not isinstance(rows, Iterable):
        raise TypeError(f"rows must be a sequence of Row (from load_results), got {type(rows).__name__}")
    rows = list(rows)
    bad = [r for r in rows if not isinstance(r, Row)]
    if bad:
        raise TypeError(f"rows must hold Row objects (from load_results), got {type(bad[0]).__name__}")
    if not rows:
        raise ValueError("rows is empty: nothing to report (load_results found no figures)")
    return rows


# -------------------------------------------------------------------------------------------------- writing


def atomic_write(path: Path, write: Callable[[Path], object]) -> Path:
    """Create ``path`` through a temporary file in the same folder renamed into place, so no reader (and no
    interrupted run) ever sees a half-written file.

    Args:
        path: the final file.
        write: called with the temporary path; must write the whole file there.

    Returns:
        ``path``.
    """
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    os.close(handle)
    try:
        # mkstemp makes the file private (0600); a report is meant to be read like any other file.
        os.chmod(temporary, 0o644)
        write(Path(temporary))
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path


def charts(rows: Sequence[Row], out_dir: str | os.PathLike[str]) -> list[Path]:
    """Draw the PNG charts of the rows into ``out_dir`` (see `pitfalls.report_charts`).

    Args:
        rows: rows from `load_results`.
        out_dir: folder for the PNGs (created if missing).

    Returns:
        The paths of the PNGs written.
    """
    from pitfalls import report_charts  # matplotlib is only needed for charts

    return [path for path, _ in report_charts.write_charts(_checked_rows(rows), Path(out_dir))]


def write_report(
    results_dir: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    machine: str | None = None,
    commit: str | None = None,
) -> Path:
    """Write ``out_dir/README.md`` (the summary with its charts linked) and the chart PNGs.

    Only files inside ``out_dir`` are created or replaced, each atomically; the README is written last, so it
    never links a chart that is not there.

    Args:
        results_dir: asv's results folder.
        out_dir: the report folder (created if missing); must not be inside ``results_dir``.
        machine: only this machine (default: all).
        commit: only this commit (default: each environment's newest).

    Returns:
        The path of the README.
    """
    from pitfalls import report_charts

    out = Path(out_dir)
    results = Path(results_dir)
    if results.is_dir() and (out.resolve() == results.resolve() or results.resolve() in out.resolve().parents):
        raise ValueError(
            f"out_dir={str(out)!r} is inside results_dir={str(results)!r}; the results folder holds asv's files "
            "only: choose another folder"
        )
    rows = load_results(results, machine=machine, commit=commit)
    if out.exists() and not out.is_dir():
        raise ValueError(f"out_dir={str(out)!r} exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    written = report_charts.write_charts(rows, out)
    linked: dict[tuple[str, str, str, str], list[str]] = defaultdict(list)
    for path, key in written:
        linked[key].append(path.name)
    text = summary_markdown(rows, linked)
    return atomic_write(out / "README.md", lambda p: p.write_text(text, encoding="utf-8"))

"""Rows -> the report's markdown (docs/report.md): nothing here knows a family or a figure by name beyond a preferred
column order.
"""

from __future__ import annotations

import datetime as dt
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asv import util as asv_util

from pitfalls.markdown import table as markdown_table
from pitfalls.report.calibration_errors import is_calibration_error
from pitfalls.report.loading import LoadedResults
from pitfalls.report.rows import FAILED, FLOOR, OK, SKIPPED, Row, baseline_variant, checked_rows, env_label, group

__all__ = ["NA_NOTE", "comparison_markdown", "format_value", "summary_markdown"]

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
# Units every cell already shows (adaptive time and bytes, "2.5x", "87 %"): they stay out of the column heading.
_SHOWN_UNITS = ("", "seconds", "bytes", "x", "%")

NA_NOTE = (
    "**n/a**: skipped by the benchmark, because the figure cannot be measured on that machine (no GPU, no NVML, "
    "too big for memory, ...); `asv run --show-stderr` prints each reason. **failed**: the benchmark raised an "
    "error. Neither is ever shown as a number. **x floor**: the variant's time per call divided by the time of the "
    f"family's `{FLOOR}` case (the best the hardware can do for the same job) at the same other parameters."
)
_NO_FLOOR = (
    f"x floor: n/a for every case: these results have no `{FLOOR}` case (the family has none, or they were "
    "measured before it had one)."
)


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


def _cell(row: Row | None) -> str:
    # A blank cell: this figure has no benchmark for this case (not a skip).
    return format_value(row.value, row.unit, row.status) if row else ""


def _floor_cell(row: Row | None, floor: Row | None) -> str:
    """The variant's time over the floor's, or n/a with the reason."""
    if row is None or not row.measured:
        return _cell(row)
    if floor is None:
        return "n/a (floor not run)"
    if floor.status == FAILED:
        return "n/a (floor failed)"
    if not floor.measured:
        return "n/a (floor n/a)"
    assert row.value is not None and floor.value is not None  # measured
    if floor.value <= 0:
        return f"n/a (floor time {floor.value:g})"
    return f"{row.value / floor.value:.3g}x"


def _figure_heading(row: Row, baseline: str) -> str:
    key = row.figure_key
    label = _FIGURES.get(key) or key.split("_", 1)[-1].replace("_", " ")
    label = label.format(baseline=baseline)
    if key in ("time", "peakmem", "mem") or row.unit in _SHOWN_UNITS:
        return label
    return f"{label} ({row.unit})"


def _figure_order(key: str) -> tuple[int, str]:
    order = list(_FIGURES)
    return (order.index(key), key) if key in order else (len(order), key)


def _date(value: dt.datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M UTC") if value else "unknown"


def _ordered_names(names: Iterable[str]) -> list[str]:
    names = list(names)
    return (["variant"] if "variant" in names else []) + [n for n in names if n != "variant"]


# A table's cases (each parameter's value, in the table's order) -> its rows by figure or environment.
_Cases = dict[tuple[Any, ...], dict[str, Row]]


@dataclass(frozen=True)
class _Skips:
    """Which cases of a table are skipped in every column, and the parameter values skipped in every case.

    A table then says "n/a for every case with device=cuda" once instead of repeating such lines; other n/a cases
    stay in the table.
    """

    cases: list[dict[str, Any]]
    all_na: list[dict[str, Any]]
    dead: list[tuple[str, Any]]

    @classmethod
    def of(cls, names: Sequence[str], table: _Cases, keys: Iterable[str]) -> _Skips:
        keys = list(keys)
        cases = [dict(zip(names, case, strict=True)) for case in table]
        all_na = [case for case, by_key in zip(cases, table.values(), strict=True)
                  if all(by_key.get(k) is None or by_key[k].status == SKIPPED for k in keys)]
        dead = []
        if len(all_na) < len(cases):
            # A value (such as device=cuda) of more than one case, though not of every case, all of them n/a.
            for name in names:
                for value in dict.fromkeys(c[name] for c in cases):
                    having = [c for c in cases if c[name] == value]
                    if 1 < len(having) < len(cases) and all(c in all_na for c in having):
                        dead.append((name, value))
        return cls(cases, all_na, dead)

    @property
    def everything(self) -> bool:
        """True when every case is n/a in every column."""
        return len(self.all_na) == len(self.cases)

    def shown(self, names: Sequence[str], case: tuple[Any, ...]) -> bool:
        """False for a case that a dead value's one line already covers."""
        values = dict(zip(names, case, strict=True))
        return not any(values[n] == v for n, v in self.dead)

    def lines(self, prefix: str) -> list[str]:
        """One line per dead value: "<prefix> for every case with name=value (count cases)."."""
        lines = []
        for name, value in self.dead:
            count = sum(1 for c in self.cases if c[name] == value)
            lines += [f"{prefix} for every case with {name}={value} ({count} cases).", ""]
        return lines


# One column of a table: its heading, and how a case's cell is made from the case's rows (figure -> row).
_Column = tuple[str, Callable[[tuple[Any, ...], dict[str, Row]], str]]


def _figure_column(key: str, heading: str) -> _Column:
    return heading, lambda _case, by_key: _cell(by_key.get(key))


def _floor_column(key: str, heading: str, names: list[str], cells: _Cases) -> _Column:
    at = names.index("variant")

    def cell(case: tuple[Any, ...], by_key: dict[str, Row]) -> str:
        floor_case = case[:at] + (FLOOR,) + case[at + 1 :]
        return _floor_cell(by_key.get(key), cells.get(floor_case, {}).get(key))

    return heading, cell


def _columns(
    names: list[str], figures: Mapping[str, list[Row]], cells: _Cases, baseline: str
) -> tuple[list[_Column], list[str]]:
    """The figure columns of a table in the preferred order, with an "x floor" column after the speedup (or the
    time) for each time_ figure, and the notes to print under the table."""
    keys = sorted(figures, key=lambda f: (_figure_order(figures[f][0].figure_key), f))
    headings = [_figure_heading(figures[k][0], baseline) for k in keys]
    if len(set(headings)) < len(headings):  # e.g. two time_ methods in one class: name them
        headings = [f"{h} ({k})" if headings.count(h) > 1 else h for h, k in zip(headings, keys, strict=True)]
    columns = [_figure_column(k, h) for k, h in zip(keys, headings, strict=True)]
    times = [k for k in keys if figures[k][0].kind == "time"]
    if "variant" not in names or not times:
        return columns, []
    if not any(case[names.index("variant")] == FLOOR for case in cells):
        return columns, [_NO_FLOOR]
    ratios = [k for k in keys if figures[k][0].unit == "x"]
    after = max(keys.index(k) for k in times + ratios) + 1
    floor_columns = [
        _floor_column(k, "x floor" if len(times) == 1 else f"x floor ({k})", names, cells) for k in times
    ]
    return columns[:after] + floor_columns + columns[after:], []


def _by_case(rows: Iterable[Row], names: Sequence[str], key: Callable[[Row], str]) -> _Cases:
    """Each case's rows by ``key``, the case being its values of the parameters ``names``, in first-seen order."""
    cases: _Cases = defaultdict(dict)
    for row in rows:
        cases[tuple(row.params[n] for n in names)][key(row)] = row
    return cases


def _tables(rows: Sequence[Row], title: str) -> list[str]:
    """The tables of one family (or one other benchmark class) in one run: one per parameter set."""
    baseline = baseline_variant(rows)
    lines: list[str] = []
    for shape, shape_rows in sorted(group(rows, lambda r: tuple(r.params)).items(), key=lambda item: -len(item[0])):
        names = _ordered_names(shape)
        figures = group(shape_rows, lambda r: r.figure)
        cells = _by_case(shape_rows, names, lambda r: r.figure)
        columns, notes = _columns(names, figures, cells, baseline)
        skips = _Skips.of(names, cells, figures)
        body = [
            [str(v) for v in case] + [cell(case, by_key) for _, cell in columns]
            for case, by_key in cells.items()
            if skips.shown(names, case)
        ]
        benchmarks = ", ".join(f"`{b}`" for b in sorted({r.benchmark for r in shape_rows}))
        per = ", ".join(n.replace("_", " ") for n in names) or "case"
        lines += [f"#### {title}: per {per}", "", f"Benchmarks: {benchmarks}.", ""]
        headings = [heading for heading, _ in columns]
        figures_text = ", ".join(h for h in headings if not h.startswith("x floor"))
        if skips.everything:
            lines += [f"{figures_text}: n/a (skipped) for every case ({len(skips.cases)} cases).", ""]
            continue
        lines += markdown_table(list(names) + headings, body)
        lines.append("")
        lines += skips.lines(f"{figures_text}: n/a (skipped)")
        for note in notes:
            lines += [note, ""]
    return lines


def _machine_line(facts: Mapping[str, Any]) -> str:
    ram = facts.get("ram")
    parts = [facts.get("cpu"), f"{facts['num_cpu']} CPUs" if facts.get("num_cpu") else None, facts.get("arch"),
             facts.get("os"), f"{int(ram) / 2**30:.1f} GiB RAM" if isinstance(ram, str) and ram.isdigit() else None]
    return " · ".join(str(part) for part in parts if part) or "no machine facts recorded"


def _env_order(row: Row) -> tuple[Any, ...]:
    """Environments with a torch version first, in version order (numbers as numbers), then the others by name."""
    if not row.torch:
        return (1, (), row.env)
    parts = row.torch.replace("+", ".").split(".")
    return (0, tuple((0, int(part), "") if part.isdigit() else (1, 0, part) for part in parts), row.env)


def _newest_first(rows: Sequence[Row]) -> tuple[dt.datetime, dt.datetime]:
    oldest = dt.datetime.min.replace(tzinfo=dt.timezone.utc)
    measured = [r.measured_at for r in rows if r.measured_at]
    return (rows[0].commit_date or oldest, max(measured, default=oldest))


def comparison_markdown(rows: Sequence[Row]) -> str:
    """Tables comparing the time per call of environments (torch versions) measured at one commit.

    Args:
        rows: rows of one or more machines; only commits measured in two or more environments are compared.

    Returns:
        Markdown, empty when no commit has two environments.
    """
    lines: list[str] = []
    for (machine, commit), commit_rows in group(rows, lambda r: (r.machine, r.commit)).items():
        envs = sorted({r.env: r for r in commit_rows}.values(), key=_env_order)
        if len(envs) < 2:
            continue
        # The torch version, with the environment's name where two share one.
        labels = [env_label(e) for e in envs]
        labels = [f"{name} ({e.env})" if labels.count(name) > 1 else name for name, e in zip(labels, envs, strict=True)]
        lines += [f"### {machine}: {' vs '.join(labels)} at commit {commit[:8]}", "",
                  f"Time per call in each environment; the last column is {labels[-1]} / {labels[0]} (below 1: "
                  "faster there).", ""]
        times = [r for r in commit_rows if r.kind == "time"]
        # Rows compare when their axes are the same: a benchmark whose axes changed between the environments'
        # runs (asv's default names in one) gets a table per set of axes.
        by_axes = group(times, lambda r: (r.family, r.benchmark, tuple(r.params)))
        for (family, benchmark, _), bench_rows in by_axes.items():
            names = _ordered_names(bench_rows[0].params)
            table = _by_case(bench_rows, names, lambda r: r.env)
            skips = _Skips.of(names, table, [e.env for e in envs])
            body = []
            for case, by_env in table.items():
                if not skips.shown(names, case):
                    continue
                cells = [by_env.get(e.env) for e in envs]
                texts = [format_value(c.value, c.unit, c.status) if c else "not run" for c in cells]
                a, b = cells[0], cells[-1]
                ratio = f"{b.value / a.value:.2f}" if a and b and a.value and b.value is not None else "n/a"
                body.append([str(v) for v in case] + texts + [ratio])
            lines += [f"#### {family}: {benchmark.rsplit('.', 1)[-1]}", "", f"Benchmark: `{benchmark}`.", ""]
            lines += markdown_table(names + [f"time, {label}" for label in labels] + ["ratio"], body)
            lines.append("")
            lines += skips.lines("n/a (skipped) in every environment")
    return "\n".join(lines)


def _torch_line(row: Row) -> str:
    if row.torch:
        return f"- torch: {row.torch} (from the {row.torch_from})" if row.torch_from else f"- torch: {row.torch}"
    return (
        "- torch: unknown: the results file names none (no `torch` in asv's params or requirements, no torch "
        "version in the environment name)"
    )


def _left_out(loaded: LoadedResults) -> list[str]:
    if not (loaded.unreadable or loaded.stand_ins):
        return []
    lines = ["## Left out of this report", ""]
    if loaded.unreadable:
        lines += ["These results could not be read and are not shown (the rest is):", ""]
        lines += [f"- {problem}" for problem in loaded.unreadable] + [""]
    if loaded.stand_ins:
        lines += ["Shown at an older commit:", ""]
        lines += [f"- {stand_in}" for stand_in in loaded.stand_ins] + [""]
    return lines


def _run_lines(env_rows: Sequence[Row], loaded: LoadedResults) -> list[str]:
    first = env_rows[0]
    measured = [r.measured_at for r in env_rows if r.measured_at]
    lines = [
        f"### {env_label(first)}, commit {first.commit[:8]}",
        "",
        f"- machine: `{first.machine}`",
        f"- commit: `{first.commit}` (committed {_date(first.commit_date)})",
        _torch_line(first),
        f"- asv environment: `{first.env}`",
        f"- measured: {_date(max(measured) if measured else None)}",
    ]
    for stand_in in loaded.stand_ins:
        if (stand_in.machine, stand_in.env, stand_in.shown_commit) == (first.machine, first.env, first.commit):
            lines.append(f"- **an older commit is shown**: {stand_in}")
    return lines + [""]


def _calibration_lines(rows: Sequence[Row], proof: Path | None) -> list[str]:
    # Imported here: the table knows every check, so every family; reading results needs none of them.
    from pitfalls.report.calibration_table import calibration_lines

    benchmarks = sorted({r.benchmark for r in rows if is_calibration_error(r)})
    sources = ["From " + ", ".join(f"`{name}`" for name in benchmarks) + ".", ""] if benchmarks else []
    return ["## Calibration", "", "Each check of `pitfalls calibrate` runs a known-answer workload through the code "
            "path of a published figure; its error is how far the figure read from the planted value (relative, or "
            "in the check's unit). The tolerance and the verdict are this version's; the figure is the newest the "
            "results hold, per machine. See the suite's docs/methodology.md.", "",
            *sources, *calibration_lines(rows, proof), ""]


def _uncalibrated_lines(rows: Sequence[Row]) -> list[str]:
    from pitfalls.calibration.marks import uncalibrated_benchmarks
    from pitfalls.calibration.run import all_checks

    marked = uncalibrated_benchmarks({(r.family, r.benchmark) for r in rows if r.in_suite}, all_checks())
    if not marked:
        return []
    return ["## Uncalibrated figures", "",
            "No check of `pitfalls calibrate` reads these figures on a known answer (see the suite's "
            "docs/methodology.md):", "", *[f"- `{name}`" for name in marked], ""]


def summary_markdown(
    rows: LoadedResults | Sequence[Row],
    charts_by_family: Mapping[tuple[str, str, str, str], Sequence[str]] | None = None,
    proof: Path | None = None,
) -> str:
    """The report as markdown: what was left out, then per machine and run (newest first) the family tables, then
    the comparison across torch versions.

    Args:
        rows: `read_results`'s result, or its rows (their commits measured in two or more
            environments are compared).
        charts_by_family: optional (machine, env, commit, family) -> image paths (relative to the markdown file)
            to link under the family's tables.
        proof: the folder of committed `pitfalls calibrate` outputs, columns of the calibration table (None: none).

    Returns:
        The markdown text.
    """
    if isinstance(rows, LoadedResults):
        loaded = rows
        checked_rows(loaded.rows)
    else:
        shown = tuple(checked_rows(rows))
        loaded = LoadedResults(rows=shown, compared=shown)
    lines = ["# pitfalls: benchmark report", "", NA_NOTE, ""] + _left_out(loaded)
    for note in loaded.notes:
        lines += [note, ""]
    for machine, machine_rows in sorted(group(loaded.rows, lambda r: r.machine).items()):
        lines += [f"## Machine `{machine}`", "", _machine_line(machine_rows[0].machine_facts), ""]
        runs = group(machine_rows, lambda r: (r.env, r.commit))
        lines += ["Runs, newest first.", ""]
        for (env, commit), env_rows in sorted(runs.items(), key=lambda item: _newest_first(item[1]), reverse=True):
            lines += _run_lines(env_rows, loaded)
            # The calibration errors have their own table (`_calibration_lines`), one row per check.
            tabled = [r for r in env_rows if r.in_suite and not is_calibration_error(r)]
            for family, family_rows in group(tabled, lambda r: r.family).items():
                lines += _tables(family_rows, family)
                for image in (charts_by_family or {}).get((machine, env, commit, family), ()):
                    lines += [f"![{family}: {Path(image).stem}]({image})", ""]
            others = group([r for r in env_rows if not r.in_suite], lambda r: r.benchmark.rsplit(".", 1)[0])
            if others:
                lines += [
                    "#### other benchmarks",
                    "",
                    "Results of benchmarks that the results folder's benchmarks.json does not describe (a benchmark "
                    "since renamed or removed, or whose axes have changed since, or from another suite): asv's "
                    "default parameter names.",
                    "",
                ]
            for name, other_rows in others.items():
                lines += _tables(other_rows, f"other: {name}")
    lines += _calibration_lines(loaded.rows, proof)
    lines += _uncalibrated_lines(loaded.rows)
    comparison = comparison_markdown(loaded.compared)
    if comparison:
        lines += ["## Across torch versions", ""]
        if loaded.also_compared:
            listed = ", ".join(f"{commit[:8]} (`{machine}`)" for machine, commit in loaded.also_compared)
            lines += [
                f"The newest commit measured in two or more environments. Also measured so: {listed}; "
                "`pitfalls report --commit HASH` compares one of them.",
                "",
            ]
        lines.append(comparison)
    return "\n".join(lines).rstrip() + "\n"

"""What the report's charts show, as plain data (`Chart`, `Panel`, `Series`), checked without reading pixels.

Which figures get a chart, and how a skipped one is shown: docs/report.md. Benchmarks qualify by their parameters
and units, never by their names.
"""

from __future__ import annotations

import hashlib
import re
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pitfalls.report.rows import Row, baseline_variant, env_label, group

__all__ = ["Chart", "Panel", "Series", "build_charts", "compact", "line_chart", "ratio_chart", "size_axis"]

# Parameters that draw lines (one per value) rather than panels, when a benchmark has them.
_LINES_BY = ("variant", "mode")
_TIME_UNITS = ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs"), (1e-9, "ns"))
# A ratio of largest to smallest at or above which an axis is drawn in log scale.
_LOG_RATIO = 50.0
_MAX_NOTED = 4


@dataclass(frozen=True)
class Series:
    """One line (or one set of bars) of a panel.

    Attributes:
        label: legend text, e.g. "static, compiled".
        variant: the variant it shows (sets its colour).
        style: index of its line style / bar hatch (the mode).
        points: measured (x, y) points, in x order; for bar charts x is the category index.
        missing: x positions whose figure was skipped or failed (never drawn).
    """

    label: str
    variant: str
    style: int
    points: tuple[tuple[float, float], ...]
    missing: tuple[float, ...]


@dataclass(frozen=True)
class Panel:
    """One facet of a chart: a fixed value of the parameters that are neither the x axis nor a line."""

    title: str
    series: tuple[Series, ...]


@dataclass(frozen=True)
class Chart:
    """Everything needed to draw one PNG.

    Attributes:
        key: (machine, env, commit, family) the chart belongs to.
        name: file stem.
        kind: "line" (x numeric) or "bar" (x categorical).
        title: first title line; subtitle: the machine, torch and commit.
        xlabel, ylabel: axis labels with units.
        xlog, ylog: log scales.
        xticks: x positions of a line chart's ticks (the swept sizes), labelled in short form (10k, 1M).
        categories: x tick labels of a bar chart.
        reference: y of a horizontal reference line (1.0: as fast as naive), or None; reference_label: its legend.
        panels: the facets that have at least one measured figure.
        notes: lines printed under the chart: what was skipped and is therefore not drawn.
    """

    key: tuple[str, str, str, str]
    name: str
    kind: str
    title: str
    subtitle: str
    xlabel: str
    ylabel: str
    ylog: bool
    panels: tuple[Panel, ...]
    notes: tuple[str, ...]
    xlog: bool = False
    xticks: tuple[float, ...] = ()
    categories: tuple[str, ...] = ()
    reference: float | None = None
    reference_label: str = ""


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-").lower()


def _env_slug(row: Row) -> str:
    if row.torch:
        return _slug(f"torch-{row.torch}")
    return "env-" + hashlib.sha1(row.env.encode("utf-8")).hexdigest()[:8]


def _chart(first: Row, **fields: Any) -> Chart:
    """A chart of the run and figure of ``first``: its key, file name and subtitle (the machine, torch, commit)."""
    facts = first.machine_facts
    cpu = ", ".join(
        str(p) for p in (facts.get("cpu"), f"{facts['num_cpu']} CPUs" if facts.get("num_cpu") else None) if p
    )
    machine = f"machine {first.machine}" + (f" ({cpu})" if cpu else "")
    return Chart(key=(first.machine, first.env, first.commit, first.family),
                 name=f"{first.family}-{first.figure}-{_slug(first.machine)}-{_env_slug(first)}-{first.commit[:8]}",
                 subtitle=f"{machine} · {env_label(first)} · commit {first.commit[:8]}", **fields)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _values_in_order(rows: Iterable[Row], name: str) -> list[Any]:
    return list(dict.fromkeys(row.params.get(name) for row in rows))


def size_axis(rows: Sequence[Row]) -> str | None:
    """The numeric parameter with the most values (at least two), the x axis of a chart; None when there is none.

    Args:
        rows: the rows of one benchmark.

    Returns:
        The parameter's name, or None.
    """
    best, best_count = None, 1
    for name in rows[0].params if rows else ():
        values = _values_in_order(rows, name)
        if name in _LINES_BY or not all(_is_number(v) for v in values):
            continue
        if len(values) > best_count:
            best, best_count = name, len(values)
    return best


def _facet_title(facet: tuple[tuple[str, Any], ...]) -> str:
    return ", ".join(f"{n}={v}" for n, v in facet) or "all cases"


def _time_scale(values: Sequence[float]) -> tuple[float, str]:
    typical = statistics.median(values)
    return next(((s, u) for s, u in _TIME_UNITS if typical >= s), _TIME_UNITS[-1])


def _wide(values: Sequence[float]) -> bool:
    positive = [v for v in values if v > 0]
    return len(positive) >= 2 and max(positive) / min(positive) >= _LOG_RATIO


def compact(value: Any) -> str:
    """Short form of a size for ticks and notes: 10000 -> "10k", 1000000 -> "1M"; other values as they are."""
    if _is_number(value) and value == int(value) and value >= 1000:
        for power, suffix in ((9, "G"), (6, "M"), (3, "k")):
            if int(value) % 10**power == 0:
                return f"{int(value) // 10**power}{suffix}"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _category_label(names: Sequence[str], values: Sequence[Any], separator: str) -> str:
    """A bar group's label: sizes as name=value ("n=10k"), words as they are ("compiled")."""
    return separator.join(f"{n}={compact(v)}" if _is_number(v) else str(v) for n, v in zip(names, values, strict=True))


def _missing_notes(panels: Sequence[Panel], where: Callable[[float], str]) -> list[str]:
    """Short notes on what is n/a in the drawn panels: whole lines or bar sets first, then single places."""
    labels = dict.fromkeys(s.label for p in panels for s in p.series)
    never = [label for label in labels if not any(s.points for p in panels for s in p.series if s.label == label)]
    notes = [f"{label}: n/a everywhere" for label in never]
    for panel in panels:
        shown = [s for s in panel.series if s.label not in never]
        at: dict[float, list[str]] = defaultdict(list)
        for series in shown:
            for x in series.missing:
                at[x].append(series.label)
        for x in sorted(at):
            who = "all" if len(at[x]) == len(shown) > 1 else ", ".join(at[x])
            notes.append(f"{where(x)} [{panel.title}]: {who}")
    return notes


def _notes(empty_facets: list[str], missing: list[str]) -> tuple[str, ...]:
    """Lines under a chart naming what is not drawn: whole panels with nothing measured, then single points."""
    notes = []
    if empty_facets:
        notes.append(f"not drawn, nothing measured (n/a or failed) for: {'; '.join(empty_facets)}")
    if missing:
        more = f"; and {len(missing) - _MAX_NOTED} more" if len(missing) > _MAX_NOTED else ""
        notes.append(f"not drawn (n/a or failed): {'; '.join(missing[:_MAX_NOTED])}{more}")
    return tuple(notes)


def _panels(facets: Mapping[tuple[tuple[str, Any], ...], Mapping[Any, list[Row]]],
            series_of: Callable[[Any, list[Row]], Series]) -> tuple[list[Panel], list[str]]:
    """The facets with a measured figure as panels (a series per line or variant), and the titles of the others."""
    panels, empty = [], []
    for facet, by_series in facets.items():
        series = tuple(series_of(key, rows) for key, rows in by_series.items())
        if any(s.points for s in series):
            panels.append(Panel(_facet_title(facet), series))
        else:
            empty.append(_facet_title(facet))
    return panels, empty


def _figure_label(row: Row) -> str:
    return "time per call" if row.kind == "time" else row.figure.split("_", 1)[-1].replace("_", " ")


def line_chart(rows: Sequence[Row]) -> Chart | None:
    """One figure over the size axis: lines per variant and mode, panels per the other parameters.

    Args:
        rows: the rows of one time_ (or throughput) benchmark in one machine, environment and commit.

    Returns:
        The chart, or None when nothing was measured or the benchmark has no size axis.
    """
    measured = [r.value for r in rows if r.measured and r.value is not None]
    axis = size_axis(rows)
    if not measured or axis is None:
        return None
    first = rows[0]
    scale, unit = _time_scale(measured) if first.kind == "time" else (1.0, first.unit)
    lines_by = [n for n in _LINES_BY if n in first.params]
    styles = {mode: i for i, mode in enumerate(_values_in_order(rows, "mode"))} if "mode" in lines_by else {}
    facets: dict[tuple[tuple[str, Any], ...], dict[tuple[Any, ...], list[Row]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        facet = tuple((n, v) for n, v in row.params.items() if n not in lines_by and n != axis)
        facets[facet][tuple(row.params[n] for n in lines_by)].append(row)
    label = _figure_label(first)

    def line(line_key: tuple[Any, ...], line_rows: list[Row]) -> Series:
        ok = [(r.params[axis], r.value) for r in line_rows if r.measured and r.value is not None]
        values = dict(zip(lines_by, line_key, strict=True))
        return Series(
            label=", ".join(str(v) for v in line_key) or label,
            variant=str(values.get("variant", "")),
            style=styles.get(values.get("mode"), 0),
            points=tuple(sorted((float(x), value / scale) for x, value in ok)),
            missing=tuple(sorted(float(r.params[axis]) for r in line_rows if not r.measured)),
        )

    panels, empty = _panels(facets, line)
    notes = _notes(empty, _missing_notes(panels, lambda x: f"{axis}={compact(int(x) if x == int(x) else x)}"))
    xs = [float(v) for v in _values_in_order(rows, axis)]
    wide_x, wide_y = _wide(xs), _wide(measured)
    return _chart(
        first,
        kind="line",
        title=f"{first.family}: {label} ({first.benchmark.split('.', 1)[-1]})",
        xlabel=axis.replace("_", " ") + (" (log scale)" if wide_x else ""),
        ylabel=f"{label} ({unit})" + (" (log scale)" if wide_x or wide_y else ""),
        xlog=wide_x,
        ylog=wide_x or wide_y,
        xticks=tuple(xs),
        panels=tuple(panels),
        notes=notes,
    )


def ratio_chart(rows: Sequence[Row]) -> Chart | None:
    """A ratio to the baseline variant (unit "x"): bars from 1 per other variant and size, panels per the
    parameters that are not numbers (device, mode...).

    Args:
        rows: the rows of one ratio track_ benchmark in one machine, environment and commit.

    Returns:
        The chart, or None when nothing but the baseline was measured or the benchmark has no size axis.
    """
    first = rows[0]
    baseline = baseline_variant(rows)
    shown = [r for r in rows if r.params.get("variant") != baseline]
    if size_axis(rows) is None or not any(r.measured for r in shown):
        return None
    names = [n for n in first.params if n != "variant"]
    facet_by = [n for n in names if not all(_is_number(v) for v in _values_in_order(rows, n))]
    category_by = [n for n in names if n not in facet_by]
    categories = list(dict.fromkeys(tuple(r.params[n] for n in category_by) for r in shown))
    styles = {v: i for i, v in enumerate(_values_in_order(shown, "variant"))}
    facets: dict[tuple[tuple[str, Any], ...], dict[str, list[Row]]] = defaultdict(lambda: defaultdict(list))
    for row in shown:
        facets[tuple((n, row.params[n]) for n in facet_by)][str(row.params.get("variant", ""))].append(row)

    def bars(variant: str, variant_rows: list[Row]) -> Series:
        points, missing = [], []
        for row in variant_rows:
            x = float(categories.index(tuple(row.params[n] for n in category_by)))
            if row.measured and row.value is not None:
                points.append((x, row.value))
            else:
                missing.append(x)
        return Series(variant, variant, styles[variant], tuple(sorted(points)), tuple(sorted(missing)))

    panels, empty = _panels(facets, bars)
    values = [y for p in panels for s in p.series for _, y in s.points] + [1.0]
    notes = _notes(empty, _missing_notes(panels, lambda x: _category_label(category_by, categories[int(x)], ", ")))
    wide = _wide(values)
    label = _figure_label(first)
    return _chart(
        first,
        kind="bar",
        title=f"{first.family}: {label} over {baseline} with the same other parameters "
        f"({first.benchmark.split('.', 1)[-1]})",
        xlabel=", ".join(n.replace("_", " ") for n in category_by),
        ylabel=f"{label} over {baseline} (x, above 1 = faster)" + (" (log scale)" if wide else ""),
        ylog=wide,
        categories=tuple(_category_label(category_by, c, "\n") for c in categories),
        reference=1.0,
        reference_label=f"{baseline} (1x)",
        panels=tuple(panels),
        notes=notes,
    )


def _chart_of(rows: Sequence[Row]) -> Chart | None:
    first = rows[0]
    if first.unit == "x":
        return ratio_chart(rows)
    if first.kind == "time" or first.unit.endswith("/s"):
        return line_chart(rows)
    return None


def build_charts(rows: Sequence[Row]) -> list[Chart]:
    """Build every chart of the rows: per machine, environment, commit and benchmark of the suite, one for each
    time_, throughput (unit ".../s") or ratio (unit "x") figure that has a size axis.

    Args:
        rows: rows from `pitfalls.report.read_results`.

    Returns:
        The charts that have something measured to show.
    """
    runs = group([row for row in rows if row.in_suite], lambda r: (r.machine, r.env, r.commit, r.benchmark))
    return [chart for one in runs.values() if (chart := _chart_of(one)) is not None]

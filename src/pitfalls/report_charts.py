"""Charts of the report: time per call across the size axis, and speedup over the naive variant (PNG).

Each chart is first built as plain data (`Chart`, `Panel`, `Series`) and only then drawn, so what is plotted can be
checked without reading pixels. A skipped or failed figure is never a point or a bar: it is left out of the
series' data (a line is broken there, not bridged) and named under the chart.
"""

from __future__ import annotations

import hashlib
import math
import re
import statistics
import textwrap
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullFormatter, NullLocator

from pitfalls.report import OK, Row, atomic_write, baseline_variant, env_label

__all__ = ["Chart", "Panel", "Series", "build_charts", "render", "write_charts"]

# Axes that are never the size axis of a time chart: they are lines (variant, mode) or facets (device).
_CATEGORICAL = ("variant", "mode", "device")
_TIME_UNITS = ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs"), (1e-9, "ns"))
_LINESTYLES = ("-", "--", ":", "-.")
_MARKERS = ("o", "s", "^", "D")
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
    xlog: bool
    ylog: bool
    xticks: tuple[float, ...]
    categories: tuple[str, ...]
    reference: float | None
    reference_label: str
    panels: tuple[Panel, ...]
    notes: tuple[str, ...]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-").lower()


def _env_slug(row: Row) -> str:
    if row.torch:
        return _slug(f"torch-{row.torch}")
    return "env-" + hashlib.sha1(row.env.encode("utf-8")).hexdigest()[:8]


def _chart_name(row: Row) -> str:
    return f"{row.family}-{row.figure}-{_slug(row.machine)}-{_env_slug(row)}-{row.commit[:8]}"


def _subtitle(row: Row) -> str:
    facts = row.machine_facts
    cpu = ", ".join(
        str(p) for p in (facts.get("cpu"), f"{facts['num_cpu']} CPUs" if facts.get("num_cpu") else None) if p
    )
    machine = f"machine {row.machine}" + (f" ({cpu})" if cpu else "")
    return f"{machine} · {env_label(row)} · commit {row.commit[:8]}"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _values_in_order(rows: Iterable[Row], name: str) -> list[Any]:
    seen: dict[Any, None] = {}
    for row in rows:
        seen.setdefault(row.params.get(name), None)
    return list(seen)


def _size_axis(rows: Sequence[Row]) -> str | None:
    """The numeric parameter with the most values (at least two): the x axis of a line chart."""
    best, best_count = None, 1
    for name in rows[0].params:
        values = _values_in_order(rows, name)
        if name in _CATEGORICAL or not all(_is_number(v) for v in values):
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


def _compact(value: Any) -> str:
    """Short form of a size for ticks and notes: 10000 -> "10k", 1000000 -> "1M"; other values as they are."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value == int(value) and value >= 1000:
        for power, suffix in ((9, "G"), (6, "M"), (3, "k")):
            if int(value) % 10**power == 0:
                return f"{int(value) // 10**power}{suffix}"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _category_label(names: Sequence[str], values: Sequence[Any], separator: str) -> str:
    """A bar group's label: sizes as name=value ("n=10k"), words as they are ("compiled")."""
    return separator.join(f"{n}={_compact(v)}" if _is_number(v) else str(v) for n, v in zip(names, values))


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


def _style_of(rows: Sequence[Row]) -> dict[Any, int]:
    return {mode: i % len(_LINESTYLES) for i, mode in enumerate(_values_in_order(rows, "mode"))}


def time_chart(rows: Sequence[Row]) -> Chart | None:
    """Time per call of one time_ benchmark: lines per variant and mode over the size axis, panels per the rest.

    With no parameter that varies in size, the chart is a bar chart of the variants instead.

    Args:
        rows: the rows of one time_ benchmark in one machine, environment and commit.

    Returns:
        The chart, or None when nothing was measured.
    """
    measured = [r.value for r in rows if r.status == OK and r.value is not None]
    if not measured:
        return None
    first = rows[0]
    axis = _size_axis(rows)
    scale, unit = _time_scale(measured)
    styles = _style_of(rows)
    variants = _values_in_order(rows, "variant")
    has_mode = "mode" in first.params
    lines_by = ["variant"] + (["mode"] if has_mode else [])
    if axis is None:
        # Nothing to sweep: one bar per variant, one bar colour per variant, one hatch per mode.
        lines_by = ["mode"] if has_mode else []
    excluded = set(lines_by) | {axis} | ({"variant"} if axis is None else set())
    facets: dict[tuple[tuple[str, Any], ...], dict[tuple[Any, ...], list[Row]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        facet = tuple((n, v) for n, v in row.params.items() if n not in excluded)
        facets[facet][tuple(row.params.get(n) for n in lines_by)].append(row)
    panels, empty = [], []
    for facet, groups in facets.items():
        series = []
        for line_key, line_rows in groups.items():
            points, missing = [], []
            label = ", ".join(str(v) for v in line_key) or "time"
            for row in line_rows:
                x = float(row.params[axis]) if axis else float(variants.index(row.params["variant"]))
                if row.status == OK and row.value is not None:
                    points.append((x, row.value / scale))
                else:
                    missing.append(x)
            variant = str(line_key[0]) if axis else str(first.params.get("variant", ""))
            mode = line_key[-1] if has_mode else None
            series.append(
                Series(
                    label=label,
                    variant=variant if axis else "",
                    style=styles.get(mode, 0),
                    points=tuple(sorted(points)),
                    missing=tuple(sorted(missing)),
                )
            )
        if any(s.points for s in series):
            panels.append(Panel(_facet_title(facet), tuple(series)))
        else:
            empty.append(_facet_title(facet))
    if axis:
        missing_notes = _missing_notes(panels, lambda x: f"{axis}={_compact(int(x) if x == int(x) else x)}")
    else:
        missing_notes = _missing_notes(panels, lambda x: f"variant={variants[int(x)]}")
    notes = _notes(empty, missing_notes)
    xs = [float(v) for v in _values_in_order(rows, axis)] if axis else []
    wide_x = _wide(xs)
    return Chart(
        key=(first.machine, first.env, first.commit, first.family),
        name=_chart_name(first),
        kind="line" if axis else "bar",
        title=f"{first.family}: time per call ({first.benchmark.split('.', 1)[-1]})",
        subtitle=_subtitle(first),
        xlabel=(axis.replace("_", " ") + (" (log scale)" if wide_x else "")) if axis else "variant",
        ylabel=f"time per call ({unit})" + (" (log scale)" if (wide_x or _wide(measured)) and axis else ""),
        xlog=wide_x,
        ylog=bool(axis) and (wide_x or _wide(measured)),
        xticks=tuple(xs),
        categories=tuple(str(v) for v in variants) if not axis else (),
        reference=None,
        reference_label="",
        panels=tuple(panels),
        notes=notes,
    )


def speedup_chart(rows: Sequence[Row]) -> Chart | None:
    """Speedup over the baseline variant: bars from 1 per (other) variant and case, panels per device.

    Args:
        rows: the rows of one speedup track_ benchmark in one machine, environment and commit.

    Returns:
        The chart, or None when nothing but the baseline was measured.
    """
    first = rows[0]
    baseline = baseline_variant(rows)
    shown = [r for r in rows if r.params.get("variant") != baseline]
    if not any(r.status == OK and r.value is not None for r in shown):
        return None
    # One panel per device and mode, so that each panel's bars compare variants at the sizes only.
    facet_by = [n for n in ("device", "mode") if n in first.params]
    category_by = [n for n in first.params if n not in facet_by and n != "variant"]
    categories = list(dict.fromkeys(tuple(r.params[n] for n in category_by) for r in shown))
    styles = {v: i for i, v in enumerate(_values_in_order(shown, "variant"))}
    facets: dict[tuple[tuple[str, Any], ...], dict[str, list[Row]]] = defaultdict(lambda: defaultdict(list))
    for row in shown:
        facets[tuple((n, row.params[n]) for n in facet_by)][str(row.params["variant"])].append(row)
    panels, empty = [], []
    for facet, by_variant in facets.items():
        series = []
        for variant, variant_rows in by_variant.items():
            points, missing = [], []
            for row in variant_rows:
                x = float(categories.index(tuple(row.params[n] for n in category_by)))
                if row.status == OK and row.value is not None:
                    points.append((x, row.value))
                else:
                    missing.append(x)
            series.append(Series(variant, variant, styles[variant], tuple(sorted(points)), tuple(sorted(missing))))
        if any(s.points for s in series):
            panels.append(Panel(_facet_title(facet), tuple(series)))
        else:
            empty.append(_facet_title(facet))
    values = [y for p in panels for s in p.series for _, y in s.points] + [1.0]
    notes = _notes(empty, _missing_notes(panels, lambda x: _category_label(category_by, categories[int(x)], ", ")))
    wide = _wide(values)
    return Chart(
        key=(first.machine, first.env, first.commit, first.family),
        name=_chart_name(first),
        kind="bar",
        title=f"{first.family}: speedup over {baseline} with the same other parameters "
        f"({first.benchmark.split('.', 1)[-1]})",
        subtitle=_subtitle(first),
        xlabel=", ".join(n.replace("_", " ") for n in category_by),
        ylabel=f"speedup over {baseline} (x, above 1 = faster)" + (" (log scale)" if wide else ""),
        xlog=False,
        ylog=wide,
        xticks=(),
        categories=tuple(_category_label(category_by, c, "\n") for c in categories),
        reference=1.0,
        reference_label=f"{baseline} (1x)",
        panels=tuple(panels),
        notes=notes,
    )


def build_charts(rows: Sequence[Row]) -> list[Chart]:
    """Build every chart of the rows: per machine, environment, commit and family, one per time_ benchmark and
    one per speedup benchmark (a track_ whose unit is "x").

    Args:
        rows: rows from `pitfalls.report.load_results`.

    Returns:
        The charts that have something measured to show.
    """
    groups: dict[tuple[str, str, str, str], list[Row]] = defaultdict(list)
    for row in rows:
        if row.kind == "time" or (row.kind == "track" and row.unit == "x"):
            groups[(row.machine, row.env, row.commit, row.benchmark)].append(row)
    built = []
    for group in groups.values():
        chart = time_chart(group) if group[0].kind == "time" else speedup_chart(group)
        if chart is not None:
            built.append(chart)
    return built


def _colour(variant: str, palette: dict[str, str]) -> str:
    colours = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")
    if variant not in palette:
        palette[variant] = colours[len(palette) % len(colours)]
    return palette[variant]


def _segments(series: Series) -> list[list[tuple[float, float]]]:
    """Split a line at its missing points so that no line is drawn across a skipped figure."""
    runs: list[list[tuple[float, float]]] = [[]]
    for point in series.points:
        if runs[-1] and any(runs[-1][-1][0] < m < point[0] for m in series.missing):
            runs.append([])
        runs[-1].append(point)
    return [run for run in runs if run]


def _draw_lines(ax: Any, panel: Panel, palette: dict[str, str]) -> None:
    for series in panel.series:
        colour = _colour(series.variant, palette)
        for i, run in enumerate(_segments(series)):
            ax.plot(
                [x for x, _ in run],
                [y for _, y in run],
                color=colour,
                linestyle=_LINESTYLES[series.style % len(_LINESTYLES)],
                marker=_MARKERS[series.style % len(_MARKERS)],
                label=series.label if i == 0 else "_nolegend_",
                gid=series.label,
            )


def _draw_bars(ax: Any, chart: Chart, panel: Panel, palette: dict[str, str]) -> None:
    count = max(len(panel.series), 1)
    width = 0.8 / count
    # On a log axis a bar cannot start at 0: it starts at the reference (1 = as fast as naive), so bars above it
    # are faster and bars below slower. On a linear axis bars start at 0, so their heights compare honestly.
    bottom = chart.reference if chart.ylog and chart.reference is not None else 0.0
    for i, series in enumerate(panel.series):
        offset = (i - (count - 1) / 2) * width
        colour = _colour(series.variant or series.label, palette)
        hatch = (None, "//", "..", "xx")[series.style % 4] if not series.variant else None
        xs = [x + offset for x, _ in series.points]
        heights = [y - bottom for _, y in series.points]
        bars = ax.bar(
            xs,
            heights,
            width=width * 0.95,
            bottom=bottom,
            color=colour,
            hatch=hatch,
            edgecolor="black",
            linewidth=0.4,
            label=series.label,
            gid=series.label,
        )
        unit = "x" if chart.reference is not None else ""
        texts = ax.bar_label(bars, labels=[f"{y:.3g}{unit}" for _, y in series.points], fontsize=7, padding=2)
        for text in texts:  # readable where the reference line crosses a label
            text.set_bbox({"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 0.5})
        for x in series.missing:
            ax.annotate(
                "n/a",
                (x + offset, 0),
                xycoords=("data", "axes fraction"),
                xytext=(0, 3),
                textcoords="offset points",
                ha="center",
                va="bottom",
                fontsize=8,
                color="dimgray",
                style="italic",
            )
    ax.set_xticks(range(len(chart.categories)), chart.categories, fontsize=8)
    ax.set_xlim(-0.6, len(chart.categories) - 0.4)


def _plain_log_labels(axis: Any) -> None:
    """Label a log axis with plain numbers (0.1, 20, 300), and some minor ticks too when it spans few decades."""
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    low, high = axis.get_view_interval()
    decades = math.log10(high / low) if low > 0 else math.inf
    # Enough labels to read values off the axis, few enough not to collide: 2, 3, 5 per decade, or 2 and 5.
    digits = ("2", "3", "5") if decades < 1.5 else ("2", "5") if decades < 3 else ()
    axis.set_minor_formatter(
        FuncFormatter(lambda v, _: f"{v:g}" if f"{v:g}".lstrip("0.")[:1] in digits else "")
        if digits
        else NullFormatter()
    )


def render(chart: Chart) -> Figure:
    """Draw a chart on a new matplotlib figure (Agg canvas; no pyplot state).

    Args:
        chart: from `build_charts`.

    Returns:
        The figure.
    """
    n = len(chart.panels)
    bars_per_group = max((len(p.series) for p in chart.panels), default=1)
    bar_width = max(4.5, len(chart.categories) * (0.3 * bars_per_group + 0.35))
    panel_width = bar_width if chart.kind == "bar" else 5.2
    # As many panels side by side as fit in about 16 inches (at most 3).
    columns = max(1, min(n, 3, int(16 // panel_width)))
    rows = math.ceil(n / columns)
    legend_width = 1.8
    height = 3.9 * rows + 1.3 + 0.25 * len(chart.notes)
    figure = Figure(figsize=(panel_width * columns + legend_width, height), layout="constrained")
    FigureCanvasAgg(figure)
    # Speedup panels share one scale so that bars compare across panels; times differ by orders between panels.
    axes = figure.subplots(rows, columns, squeeze=False, sharey=chart.reference is not None)
    palette: dict[str, str] = {}
    for ax, panel in zip(axes.flat, chart.panels):
        if chart.kind == "line":
            _draw_lines(ax, panel, palette)
        else:
            _draw_bars(ax, chart, panel, palette)
        if chart.reference is not None:
            ax.axhline(chart.reference, color="black", linewidth=0.8, linestyle="--", label=chart.reference_label)
        if chart.xlog:
            ax.set_xscale("log")
        if chart.xticks:
            # Ticks at exactly the swept sizes, in short form, instead of 10^k decades.
            ax.set_xticks(chart.xticks, [_compact(int(x) if x == int(x) else x) for x in chart.xticks])
            ax.xaxis.set_minor_locator(NullLocator())
        if chart.ylog:
            ax.set_yscale("log")
            _plain_log_labels(ax.yaxis)
        ax.set_title(panel.title, fontsize=10)
        ax.set_xlabel(chart.xlabel)
        ax.set_ylabel(chart.ylabel)
        ax.grid(True, which="major", alpha=0.3)
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    # One legend for the figure, outside the panels: a legend inside covers bars and their labels.
    legend: dict[str, Any] = {}
    for ax in list(axes.flat)[:n]:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    if legend:
        figure.legend(list(legend.values()), list(legend), loc="outside right center", fontsize=8)
    width_chars = int(figure.get_figwidth() * 11)
    figure.suptitle(chart.title + "\n" + textwrap.fill(chart.subtitle, width_chars), fontsize=10)
    if chart.notes:
        notes = [textwrap.fill(note, int(figure.get_figwidth() * 14)) for note in chart.notes]
        figure.supxlabel("\n".join(notes), fontsize=8, color="dimgray")
    return figure


def write_charts(rows: Sequence[Row], out_dir: Path) -> list[tuple[Path, tuple[str, str, str, str]]]:
    """Build, draw and save every chart as ``out_dir/<name>.png`` (each written atomically).

    Args:
        rows: rows from `pitfalls.report.load_results`.
        out_dir: folder for the PNGs (created if missing).

    Returns:
        (path, (machine, env, commit, family)) per PNG written.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for chart in build_charts(rows):
        figure = render(chart)

        def save(path: Path, figure: Figure = figure) -> None:
            figure.savefig(path, format="png", dpi=110)

        written.append((atomic_write(out_dir / f"{chart.name}.png", save), chart.key))
    return written

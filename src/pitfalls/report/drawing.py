"""Draw the report's charts (`pitfalls.report.chart_data`) with matplotlib's Agg canvas and save them as PNG.

Only this module needs matplotlib; the rest of the report loads without it.
"""

from __future__ import annotations

import functools
import math
import textwrap
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullFormatter, NullLocator

from pitfalls.report.chart_data import Chart, Panel, Series, build_charts, compact
from pitfalls.report.rows import FLOOR, Row
from pitfalls_asv_main import atomic_write

__all__ = ["render", "write_charts"]

_LINESTYLES = ("-", "--", ":", "-.")
_MARKERS = ("o", "s", "^", "D")
_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")
# The floor is a reference, not a competitor: always the same dark grey, in every chart.
_FLOOR_COLOUR = "#404040"


def _colour(variant: str, palette: dict[str, str]) -> str:
    if variant == FLOOR:
        return _FLOOR_COLOUR
    return palette.setdefault(variant, _COLOURS[len(palette) % len(_COLOURS)])


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
                *zip(*run, strict=True),
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
        bars = ax.bar(xs, heights, width=width * 0.95, bottom=bottom, color=colour, hatch=hatch, edgecolor="black",
                      linewidth=0.4, label=series.label, gid=series.label)
        unit = "x" if chart.reference is not None else ""
        texts = ax.bar_label(bars, labels=[f"{y:.3g}{unit}" for _, y in series.points], fontsize=7, padding=2)
        for text in texts:  # readable where the reference line crosses a label
            text.set_bbox({"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 0.5})
        for x in series.missing:
            ax.annotate("n/a", (x + offset, 0), xycoords=("data", "axes fraction"), xytext=(0, 3), fontsize=8,
                        textcoords="offset points", ha="center", va="bottom", color="dimgray", style="italic")
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
    for ax, panel in zip(axes.flat, chart.panels, strict=False):
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
            ax.set_xticks(chart.xticks, [compact(int(x) if x == int(x) else x) for x in chart.xticks])
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
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=False):
            legend.setdefault(label, handle)
    if legend:
        figure.legend(list(legend.values()), list(legend), loc="outside right center", fontsize=8)
    width_chars = int(figure.get_figwidth() * 11)
    figure.suptitle(chart.title + "\n" + textwrap.fill(chart.subtitle, width_chars), fontsize=10)
    if chart.notes:
        notes = [textwrap.fill(note, int(figure.get_figwidth() * 14)) for note in chart.notes]
        figure.supxlabel("\n".join(notes), fontsize=8, color="dimgray")
    return figure


def write_charts(rows: list[Row], out_dir: Path) -> list[tuple[Path, tuple[str, str, str, str]]]:
    """Build, draw and save every chart as ``out_dir/<name>.png`` (each written atomically).

    Args:
        rows: rows from `pitfalls.report.read_results`.
        out_dir: folder for the PNGs (created if missing).

    Returns:
        (path, (machine, env, commit, family)) per PNG written.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for chart in build_charts(rows):
        save = functools.partial(render(chart).savefig, format="png", dpi=110)
        written.append((atomic_write(out_dir / f"{chart.name}.png", save), chart.key))
    return written

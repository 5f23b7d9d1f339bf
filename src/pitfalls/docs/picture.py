"""The README's picture: one chart of `pitfalls report`, drawn from a committed results file by the report's own
chart code, saved as a PNG that carries the fingerprint of the data it was drawn from.

The PNG's bytes depend on matplotlib's version; its data does not. So the PNG holds, in a text chunk, the
SHA-256 of the chart's data (`Chart`, as JSON), and a page is stale when the committed results give other data.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

from pitfalls.report.chart_data import Chart, build_charts
from pitfalls.report.loading import file_rows

__all__ = ["KEY", "chart_of", "draw", "fingerprint", "png_fingerprint"]

KEY = "pitfalls-chart-data"


def chart_of(results_file: Path, benchmark: str) -> Chart:
    """The report's chart of one benchmark in one results file.

    Raises:
        ValueError: the report draws no chart of that benchmark from that file (no size axis, nothing measured).
    """
    rows = [row for row in file_rows(results_file) if row.benchmark == benchmark]
    charts = build_charts(rows)
    if len(charts) != 1:
        raise ValueError(f"the report draws no chart of {benchmark} from {results_file}")
    return charts[0]


def fingerprint(chart: Chart) -> str:
    """SHA-256 of the chart's data as canonical JSON."""
    data = json.dumps(dataclasses.asdict(chart), sort_keys=True, ensure_ascii=True)
    return hashlib.sha256(data.encode("ascii")).hexdigest()


def draw(chart: Chart, path: Path) -> None:
    """Draw the chart with the report's drawing code and save it as a PNG carrying its data's fingerprint."""
    from pitfalls.report.drawing import render  # matplotlib loads only when a picture is drawn
    from pitfalls_asv_main import atomic_write

    figure = render(chart)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda p: figure.savefig(p, format="png", dpi=110, metadata={KEY: fingerprint(chart)}))


def png_fingerprint(path: Path) -> str | None:
    """The data fingerprint a PNG carries; None when the file is missing, not a PNG, or carries none."""
    from PIL import Image  # matplotlib's own PNG library: it reads the text chunks savefig wrote

    try:
        with Image.open(path) as image:
            return getattr(image, "text", {}).get(KEY)  # only a PNG has text chunks
    except (OSError, SyntaxError):  # missing, not an image, or a broken PNG (Pillow's SyntaxError)
        return None

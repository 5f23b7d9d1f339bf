"""Generate every page's blocks from the registry and the committed results; say which committed page is stale.

A block's kind picks what fills it (`KINDS`); the README's claims block, with markers of its own, is generated here
too, so one command refreshes everything.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pitfalls.docs.blocks import Block, fill
from pitfalls.docs.corpus_table import corpus_lines
from pitfalls.docs.doctor_rules import rules_lines
from pitfalls.docs.layers_table import layer_lines
from pitfalls.docs.links import broken_links
from pitfalls.docs.loader_tables import byte_lines
from pitfalls.docs.picture import chart_of, draw, fingerprint, png_fingerprint
from pitfalls.docs.proof_index import proof_lines
from pitfalls.docs.registry_tables import benchmark_lines, builtin_family, families_lines, family_lines
from pitfalls.docs.results_index import results_lines
from pitfalls.docs.results_tables import newest_lines
from pitfalls.docs.series_table import restart_lines
from pitfalls.markdown import code, link, relative
from pitfalls.report import claims
from pitfalls.report.calibration_table import calibration_lines
from pitfalls.report.chart_data import Chart
from pitfalls.report.ladder import ladder_of
from pitfalls.report.loading import read_results
from pitfalls.report.rows import Row
from pitfalls.runner.progress import durations_of, time_table

__all__ = ["KINDS", "Docs", "pages"]

PICTURES = Path("docs") / "img"


def pages(root: Path) -> list[Path]:
    """README.md and every Markdown page under docs/, as paths from ``root``."""
    found = [Path("README.md")] if (root / "README.md").is_file() else []
    return found + sorted(p.relative_to(root) for p in (root / "docs").rglob("*.md"))


@dataclass
class Docs:
    """The generated state of one checkout's pages: what each page and picture should hold.

    Attributes:
        root: the repository's root.
    """

    root: Path

    def __post_init__(self) -> None:
        self._charts: dict[Path, Chart] = {}

    @functools.cached_property
    def generated(self) -> dict[Path, str]:
        """What each page should hold, rendered once: rendering is also what finds the pictures."""
        return {page: self.page(page) for page in pages(self.root)}

    @property
    def charts(self) -> dict[Path, Chart]:
        """Every picture the pages draw, by its PNG's path: what its pixels should be drawn from."""
        _ = self.generated  # the pages name the pictures: render them first
        return self._charts

    @functools.cached_property
    def rows(self) -> list[Row]:
        """The committed asv results' rows."""
        return list(read_results(self.root / "results").rows)

    def picture(self, page: Path, results_file: str, benchmark: str) -> list[str]:
        """The picture's lines: the PNG of the report's chart of ``benchmark`` in ``results_file``, and its caption."""
        chart = chart_of(self.root / results_file, benchmark)
        png = PICTURES / f"{chart.name}.png"
        self._charts[png] = chart
        return [f"![{chart.title}]({relative(png, page)})", "",
                f"*{chart.subtitle}. Drawn by `pitfalls report`'s chart code from "
                f"{link(code(results_file), Path(results_file), page)}; `python -m pitfalls.docs --write` draws it "
                "again when the results change.*"]

    def render(self, page: Path, block: Block) -> list[str]:
        """The lines of one block of ``page``.

        Raises:
            ValueError: an unknown kind, or arguments the kind does not take (the message names the page).
        """
        kind = KINDS.get(block.kind)
        if kind is None:
            raise ValueError(f"{page}:{block.first + 1}: unknown generated block {block.kind!r}; "
                             f"allowed: {', '.join(KINDS)}")
        try:
            inspect.signature(kind).bind(self, page, *block.args)
        except TypeError:
            raise ValueError(f"{page}:{block.first + 1}: wrong arguments for {block.kind!r}: {block.args}") from None
        return kind(self, page, *block.args)

    def page(self, page: Path) -> str:
        """What ``page`` should hold: its text with every generated block filled."""
        text = (self.root / page).read_text(encoding="utf-8")
        if claims.MARK_BEGIN in text:
            begin, end = text.index(claims.MARK_BEGIN), text.index(claims.MARK_END) + len(claims.MARK_END)
            text = text[:begin] + claims.readme_block(self.root / "results", self.root / "proof") + text[end:]
        return fill(text, lambda block: self.render(page, block), str(page))

    def _stale_pages(self) -> list[Path]:
        return [page for page, text in self.generated.items() if text != (self.root / page).read_text(encoding="utf-8")]

    def _stale_pictures(self) -> list[Path]:
        return [png for png, chart in self.charts.items() if png_fingerprint(self.root / png) != fingerprint(chart)]

    def stale(self) -> list[str]:
        """One line per page or picture that differs from what generation gives."""
        return ([f"{page}: differs from what generation gives" for page in self._stale_pages()]
                + [f"{png}: not drawn from the data the committed results give" for png in self._stale_pictures()])

    def broken_links(self) -> list[str]:
        """One line per relative link of the pages that does not resolve."""
        return broken_links(self.root, [self.root / page for page in pages(self.root)])

    def write(self) -> list[Path]:
        """Write every page and picture that differs; returns what was written."""
        pages, pictures = self._stale_pages(), self._stale_pictures()
        for page in pages:
            (self.root / page).write_text(self.generated[page], encoding="utf-8")
        for png in pictures:
            draw(self.charts[png], self.root / png)
        return pages + pictures


Kind = Callable[..., list[str]]

KINDS: dict[str, Kind] = {
    "families": lambda _docs, page: families_lines(page),
    "family": lambda _docs, _page, name: family_lines(builtin_family(name)),
    "benchmarks": lambda docs, _page, name: benchmark_lines(name, docs.root / "results" / "benchmarks.json"),
    "newest": lambda docs, _page, benchmark, *filters: newest_lines(docs.rows, benchmark, filters),
    "loader-ladder": lambda docs, _page, results_file: ladder_of(docs.root / results_file),
    "loader-bytes": lambda _docs, _page: byte_lines(),
    "calibration": lambda docs, _page: calibration_lines(docs.rows, docs.root / "proof"),
    "corpus": lambda docs, _page: corpus_lines(docs.root / "proof"),
    "doctor-rules": lambda _docs, _page: rules_lines(),
    "restarts": lambda docs, _page: restart_lines(docs.root / "benchmarks" / "series.json"),
    "layers": lambda docs, _page: layer_lines(docs.root / "pyproject.toml"),
    "results-index": lambda docs, page: results_lines(docs.root, page),
    "proof-index": lambda docs, page: proof_lines(docs.root, page),
    "picture": lambda docs, page, results_file, benchmark: docs.picture(page, results_file, benchmark),
    "main-job-time": lambda docs, page, results_file: main_job_time(docs.root, page, results_file),
}


def main_job_time(root: Path, page: Path, results_file: str) -> list[str]:
    """The main job's time table from the durations asv recorded in ``results_file``.

    Raises:
        ValueError: the file holds no durations (missing, unreadable, or not an asv results file): a table of
            nothing would read as a main job that took 0 s.
    """
    durations = durations_of(root / results_file)
    if not durations.benchmarks:
        raise ValueError(f"{page}: main-job-time: {results_file} holds no asv durations (missing or not an asv "
                         "results file); name a committed results file of the main job")
    return time_table(durations)

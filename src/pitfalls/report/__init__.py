"""asv results -> a summary table (markdown) and charts (PNG): what `pitfalls report` writes (docs/report.md).

Only `drawing` needs matplotlib, and it is loaded only when charts are drawn.
"""

from pitfalls.report.chart_data import Chart, build_charts
from pitfalls.report.loading import read_results, torch_version
from pitfalls.report.markdown import comparison_markdown, format_value, summary_markdown
from pitfalls.report.rows import Row
from pitfalls.report.writing import write_report
from pitfalls_asv_main import atomic_write

__all__ = ["Chart", "Row", "atomic_write", "build_charts", "comparison_markdown", "format_value",
           "read_results", "summary_markdown", "torch_version", "write_report"]

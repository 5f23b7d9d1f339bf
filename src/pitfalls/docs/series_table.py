"""The restarted series: every restart ``benchmarks/series.json`` records, with its commit and why."""

from __future__ import annotations

import json
from pathlib import Path

from pitfalls.markdown import code, table

__all__ = ["restart_lines"]


def restart_lines(series: Path) -> list[str]:
    """One line per restart (the benchmarks restarted together on one line), in the file's order."""
    pins = json.loads(series.read_text(encoding="utf-8"))
    restarts: dict[tuple[str, str], list[str]] = {}
    for name, pin in pins.items():
        for restart in pin.get("restarts", ()):
            restarts.setdefault((restart["commit"], restart["why"]), []).append(name)
    if not restarts:
        return ["No series has restarted."]
    return table(("series", "restarts at", "why"),
                 ((", ".join(map(code, names)), code(commit), why) for (commit, why), names in restarts.items()))

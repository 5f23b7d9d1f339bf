"""A piece's outcome: its rows saved as each one comes (docs/gpu.md), its error with its traceback, and its text in
the report.
"""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pitfalls.markdown import table
from pitfalls.result import Unavailable
from pitfalls_asv_main import atomic_write

__all__ = ["ROWS_DONE", "UNFINISHED", "attempt", "is_failure", "piece_rows", "render_rows", "section_text", "value",
           "write_json"]

UNFINISHED = {"skipped": "started, not finished: the run stopped (or hung) in this check"}
# The rows a piece had finished when it stopped or raised, kept beside what happened to it.
ROWS_DONE = "rows done"


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as JSON, whole, renamed into place (the budget can stop a piece while it writes)."""
    text = json.dumps(data, indent=2, default=str) + "\n"
    atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def value(figure: Any) -> Any:
    """A JSON-able figure: the number, or ``"unavailable: <reason>"``."""
    return str(figure) if isinstance(figure, Unavailable) else figure


class _LiveRows(list):
    """A piece's rows that hand themselves to ``on_row`` after each new one: a piece stopped part-way keeps them."""

    def __init__(self, on_row: Callable[[list[Any]], None]) -> None:
        super().__init__()
        self._on_row = on_row

    def append(self, row: Any) -> None:
        super().append(row)
        self._on_row(self)


# Set by `attempt` while a piece runs: where its rows go as they come.
_on_row: Callable[[list[Any]], None] | None = None


def piece_rows() -> list[Any]:
    """The list a piece builds its rows in: live (each row saved at once) inside `attempt`, a plain one outside."""
    return [] if _on_row is None else _LiveRows(_on_row)


def is_failure(outcome: Any) -> bool:
    """Whether a piece's outcome is an error it raised (with its traceback) rather than figures."""
    return isinstance(outcome, dict) and "error" in outcome and "traceback" in outcome


def attempt(figures: dict[str, Any], key: str, measure: Callable[[], Any],
            write: Callable[[dict[str, Any]], None]) -> None:
    """Run one piece into ``figures[key]``, ``write`` saving the figures when it starts, after each row of it
    (`piece_rows`) and when it ends; if it raises, its outcome is the error and its traceback, printed too.

    Args:
        figures: the outcomes, by key; ``figures[key]`` is set.
        key: the piece's name.
        measure: the piece itself.
        write: saves ``figures`` (whole files, renamed into place: the budget can stop the piece while it writes).
    """
    global _on_row
    print(f"{key} ...", file=sys.stderr, flush=True)
    figures[key] = dict(UNFINISHED)
    write(figures)

    def on_row(rows: list[Any]) -> None:
        figures[key] = {**UNFINISHED, ROWS_DONE: list(rows)}
        write(figures)

    _on_row = on_row
    try:
        figures[key] = measure()
    except Exception as error:  # any error of the piece: recorded with its traceback, and the piece fails
        trace = traceback.format_exc()
        print(trace, file=sys.stderr, flush=True)
        done = figures[key].get(ROWS_DONE)  # the rows on_row last wrote, if any
        figures[key] = {"error": f"{type(error).__name__}: {error}", "traceback": trace}
        if done:
            figures[key][ROWS_DONE] = done
    finally:
        _on_row = None
    write(figures)


def render_rows(rows: Sequence[Mapping[str, Any]]) -> str:
    """Rows as a markdown table, its columns the keys in the order they first appear."""
    if not rows:
        return "(nothing measured)\n"
    columns = list(dict.fromkeys(key for row in rows for key in row))
    return "\n".join(table(columns, ([row.get(c, "") for c in columns] for row in rows))) + "\n"


def section_text(outcome: Any, render: Callable[[Any], str] = render_rows) -> str:
    """A piece's outcome as markdown: its figures, or why it has none (skipped, failed, stopped part-way)."""
    # The rows a piece had finished when it raised or was stopped come first, then what happened.
    finished = render(outcome[ROWS_DONE]) + "\n" if isinstance(outcome, dict) and outcome.get(ROWS_DONE) else ""
    if is_failure(outcome):
        return finished + f"**failed**: `{outcome['error']}`\n\n```\n{outcome['traceback'].rstrip()}\n```\n"
    if isinstance(outcome, dict) and set(outcome) - {ROWS_DONE} == {"skipped"}:
        after = f" (after the {len(outcome[ROWS_DONE])} rows above)" if finished else ""
        return f"{finished}skipped: {outcome['skipped']}{after}\n"
    return render(outcome)

"""A figure's newest committed values, per case and machine, for the prose that quotes one benchmark's figures."""

from __future__ import annotations

from collections.abc import Sequence

from pitfalls.markdown import code, table
from pitfalls.report.markdown import format_value
from pitfalls.report.rows import Row, recency

__all__ = ["newest_lines"]

def newest_lines(rows: Sequence[Row], benchmark: str, filters: Sequence[str]) -> list[str]:
    """The newest value of one benchmark per case and machine, with the commit it was measured at.

    Args:
        rows: the committed results' rows.
        benchmark: the asv benchmark, e.g. ``bench_loss.SyncHazards.track_sync_hazards``.
        filters: ``NAME=VALUE`` parameters the cases are fixed at (``device=cpu``); the other parameters that vary
            name the lines.

    Raises:
        ValueError: a filter is not NAME=VALUE, or no committed result matches.
    """
    fixed = dict(f.split("=", 1) for f in filters if "=" in f)
    if len(fixed) != len(filters):
        raise ValueError(f"filters {list(filters)!r} must each be NAME=VALUE")
    chosen = [r for r in rows if r.benchmark == benchmark and r.in_suite
              and all(str(r.params.get(k)).strip("'") == v for k, v in fixed.items())]
    if not chosen:
        raise ValueError(f"no committed result of {benchmark} with {fixed or 'any parameters'}")
    names = [n for n in chosen[0].params if n not in fixed and len({str(r.params.get(n)) for r in chosen}) > 1]
    newest: dict[tuple[tuple[str, ...], str], Row] = {}
    for row in chosen:
        key = (tuple(str(row.params[n]) for n in names), row.machine)
        if key not in newest or recency(row) > recency(newest[key]):
            newest[key] = row
    machines = sorted({machine for _, machine in newest})
    cases = list(dict.fromkeys(case for case, _ in newest))
    body = [(*case, *(f"{format_value(r.value, r.unit, r.status)} at {code(r.commit[:8])}"
                      if (r := newest.get((case, m))) else "-" for m in machines)) for case in cases]
    return table((*names, *map(code, machines)), body)

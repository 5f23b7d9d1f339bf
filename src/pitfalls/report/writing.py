"""The report folder: ``README.md`` with its charts linked, and the chart PNGs, each written atomically."""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path

from pitfalls.report.claims import claims_markdown, machine_sources
from pitfalls.report.loading import read_results
from pitfalls.report.markdown import summary_markdown
from pitfalls_asv_main import atomic_write

__all__ = ["write_report"]


def write_report(
    results_dir: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    machine: str | None = None,
    commit: str | None = None,
) -> Path:
    """Write ``out_dir/README.md`` (the articles' claims measured, then the summary with its charts linked),
    ``out_dir/claims.md`` and the chart PNGs, each atomically; the README last, so it never links a missing chart.

    Args:
        results_dir: asv's results folder.
        out_dir: the report folder (created if missing); must not be inside ``results_dir``.
        machine: only this machine (default: all).
        commit: only this commit, compared across its environments (default: each environment's newest, and the
            newest commit measured in two or more environments compared).

    Returns:
        The path of the README.
    """
    from pitfalls.report.drawing import write_charts  # matplotlib loads only when charts are drawn

    out = Path(out_dir)
    results = Path(results_dir)
    if results.is_dir() and (out.resolve() == results.resolve() or results.resolve() in out.resolve().parents):
        raise ValueError(
            f"out_dir={str(out)!r} is inside results_dir={str(results)!r}; the results folder holds asv's files "
            "only: choose another folder"
        )
    loaded = read_results(results, machine=machine, commit=commit)
    if out.exists() and not out.is_dir():
        raise ValueError(f"out_dir={str(out)!r} exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    linked: dict[tuple[str, str, str, str], list[str]] = defaultdict(list)
    for path, key in write_charts(list(loaded.rows), out):
        linked[key].append(path.name)
    proof = results.parent / "proof"  # the budgeted GPU runs' folder, for the claims table
    claims = claims_markdown(machine_sources(results, proof, rows=loaded.rows))
    atomic_write(out / "claims.md", lambda p: p.write_text(claims, encoding="utf-8"))
    head, _, rest = summary_markdown(loaded, linked, proof).partition("\n")
    text = f"{head}\n\n## The articles' claims, measured (claims.md)\n\n{claims}{rest}"
    return atomic_write(out / "README.md", lambda p: p.write_text(text, encoding="utf-8"))

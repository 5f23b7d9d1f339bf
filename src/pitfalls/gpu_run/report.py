"""A budgeted run's files: ``figures.json`` (every piece's outcome), ``report.md`` and the summary it ends with."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pitfalls.gpu_run.outcome import render_rows, section_text
from pitfalls.gpu_run.pieces import outcome_of
from pitfalls.gpu_run.plan import DONE, FAILED, NOT_SELECTED, OVER_BUDGET, STOPPED, Entry, Piece
from pitfalls.gpu_run.syncs import render_corpus

__all__ = ["PENDING", "figures", "render", "summary_lines"]

PENDING = {"skipped": "not reached: the run stopped before this piece"}
_STATUS_ORDER = (DONE, OVER_BUDGET, FAILED, STOPPED, NOT_SELECTED)


def figures(pieces: Sequence[Piece], entries: Sequence[Entry], out: Path, facts: Mapping[str, Any],
            seconds: float | None) -> dict[str, Any]:
    """Every piece's outcome by name, after the run's facts and its ledger; a piece not run says why."""
    done = {entry.name: entry for entry in entries}
    data: dict[str, Any] = {**facts, "seconds": seconds, "pieces": [entry.as_json() for entry in entries]}
    for piece in pieces:
        entry = done.get(piece.name)
        written = outcome_of(out, piece.name)
        if entry is not None and entry.status in (OVER_BUDGET, NOT_SELECTED):
            data[piece.name] = {"skipped": entry.reason or entry.status}
        elif written is not None:
            data[piece.name] = written
        else:
            data[piece.name] = dict(PENDING)
    return data


def summary_lines(entries: Sequence[Entry]) -> list[str]:
    """The run's summary: each status with its pieces and their seconds (a piece not run: what it needed)."""
    lines = []
    for status in _STATUS_ORDER:
        chosen = [entry for entry in entries if entry.status == status]
        if not chosen:
            continue
        seconds = sum(entry.seconds for entry in chosen)
        lines.append(f"{status}: {len(chosen)} piece(s), {seconds:.0f} s")
        for entry in chosen:
            said = f"{entry.seconds:.0f} s" if entry.started else entry.reason
            if status == FAILED and entry.reason:
                said += f" ({entry.reason})"
            lines.append(f"  {entry.name}: {said}")
    return lines


def _render_doctor(found: dict[str, Any]) -> str:
    facts = {key: value for key, value in found.items() if key != "rows"}
    return render_rows(found.get("rows", [])) + "\n" + render_rows([facts])


def _render_outcome(name: str, outcome: Any) -> str:
    render = {"proof corpus": render_corpus, "doctor": _render_doctor}.get(name, render_rows)
    if isinstance(outcome, dict) and "exit_code" in outcome:  # an asv slice
        return render_rows([outcome])
    return section_text(outcome, render)


def render(data: Mapping[str, Any], entries: Sequence[Entry], pieces: Sequence[Piece]) -> str:
    """``report.md`` of a run, also of one stopped part-way."""
    hardware = data.get("hardware", {})
    seconds = data.get("seconds")
    parts = [
        "# Budgeted GPU run\n",
        f"Device `{data.get('device')}`, machine `{data.get('machine')}` (cost kind `{data.get('kind')}`), GPU: "
        f"{hardware.get('gpus')}, torch {hardware.get('torch')}, CUDA {hardware.get('cuda')}, driver "
        f"{hardware.get('driver')}, suite commit {data.get('commit')}. Budget {data.get('budget_s')} s; wall time "
        f"{'(still running, or stopped)' if seconds is None else f'{seconds} s'}.\n",
        "## Summary\n",
        "```\n" + "\n".join(summary_lines(entries) or ["nothing has run yet"]) + "\n```\n",
        render_rows([{"piece": e.name, "group": e.group, "status": e.status, "expected s": round(e.cost_s),
                      "from": e.cost_from, "left s": round(e.left_s), "took s": round(e.seconds), "note": e.reason}
                     for e in entries]),
    ]
    for piece in pieces:
        parts += [f"## {piece.name}: {piece.title}\n", _render_outcome(piece.name, data.get(piece.name, PENDING))]
    return "\n".join(parts)

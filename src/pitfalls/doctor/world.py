"""Every rank's report of a run under torchrun, as rank 0 prints it: each finding's count per step on every rank (a
finding on some ranks only, and the wait it puts on the others), each rank's step time, the slowest rank, and DDP's
communication per step."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from pitfalls.units import human_bytes

__all__ = ["combine", "render_world"]

_Key = tuple[str, str | None, int | None]


def _key(finding: dict[str, Any]) -> _Key:
    # Not the title: a measured finding's holds the rank's own figures.
    return finding["rule"], finding["path"], finding["line"]


def _mean_ms(report: dict[str, Any]) -> float | None:
    step_ms = report.get("step_ms")
    return None if not step_ms else float(step_ms["mean"])


def combine(reports: Sequence[dict[str, Any] | None], first_to_end: str = "") -> dict[str, Any]:
    """The report of every rank, as ``--json`` prints it under torchrun.

    Args:
        reports: each rank's report object (`DoctorReport.as_json`, with its ``rank`` and ``exit_status``), in rank
            order; None for a rank that sent none.
        first_to_end: the rank that ended first, and how (`ranks.Ranks.first_to_end`).

    Returns:
        ``{"world_size", "first_to_end", "slowest_rank", "exit_status", "ranks"}`` (the exit status the worst
        rank's, 1 where one sent nothing), each finding with ``per_step_by_rank`` (None where a rank's scan never
        ran or it sent nothing) and, for a sync some rank did not make, ``only_on_ranks`` and ``wait_on_other_ranks``
        (docs/doctor.md, "Under torchrun: every rank, one report").
    """
    missing = "sent no report before the budget's end"
    ranks: list[dict[str, Any]] = [dict(report) if report is not None else {"rank": index, "missing": missing}
                                   for index, report in enumerate(reports)]
    scanned = [bool(r.get("steps", {}).get("scanned")) for r in ranks]
    counts: list[dict[_Key, float]] = [{} for _ in ranks]
    for found, report in zip(counts, ranks, strict=True):
        for finding in report.get("findings", []):
            found[_key(finding)] = found.get(_key(finding), 0.0) + (finding["per_step"] or 0.0)
    for report in ranks:
        for finding in report.get("findings", []):
            by_rank = [found.get(_key(finding), 0.0) if scanned[i] else None for i, found in enumerate(counts)]
            finding["per_step_by_rank"] = by_rank
            if finding["kind"] == "sync" and any(n == 0.0 for n in by_rank):
                finding["only_on_ranks"] = [i for i, n in enumerate(by_rank) if n]
                finding["wait_on_other_ranks"] = (finding["ms_per_step"] if finding["ms_per_step"] is not None
                                                  else f"its stall, {finding['cost']}")
    times = {index: ms for index, report in enumerate(ranks) if (ms := _mean_ms(report)) is not None}
    statuses = [int(report.get("exit_status", 1)) for report in ranks]
    return {"world_size": len(ranks), "first_to_end": first_to_end or None,
            "slowest_rank": max(times, key=times.__getitem__) if times else None, "exit_status": max(statuses),
            "ranks": ranks}


def _ddp(ddp: dict[str, Any] | None) -> str:
    if ddp is None:
        return "no DDP module"

    def ms(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.3g} ms"

    return (f"DDP: {ddp['buckets']} bucket(s) of {human_bytes(ddp['bucket_bytes'])}, "
            f"{ddp['reductions_per_step']:g} all-reduce(s) a step ({human_bytes(ddp['bytes_per_step'])} a step); "
            f"an iteration's backward: compute {ms(ddp['compute_ms'])}, all-reduce {ms(ddp['comm_ms'])}, "
            f"overlapped {ms(ddp['overlap_ms'])} ({ddp['samples']} iterations sampled)")


def render_world(world: dict[str, Any], console: Console) -> None:
    """Print what every rank measured, after rank 0's own report."""
    console.print(Text(f"every rank of {world['world_size']} (steps, step time, DDP's communication per step); "
                       f"the first to end early: {world['first_to_end'] or 'none'}"))
    for report in world["ranks"]:
        rank = report["rank"]
        if "missing" in report:
            console.print(Text(f"  rank {rank}: {report['missing']}", style="red"))
            continue
        mean = _mean_ms(report)
        timed = "no step timed" if mean is None else (
            f"{report['step_ms']['median']:.3g} ms median, {mean:.3g} ms mean"
            + (" (the slowest rank)" if rank == world["slowest_rank"] and world["world_size"] > 1 else ""))
        error = f"; failed: {report['error']['last_line']}" if report.get("error") else ""
        console.print(Text(f"  rank {rank}: {report['steps']['total']} steps, {report['ended']}{error}; {timed}; "
                           f"{_ddp(report.get('ddp'))}"))
    seen: dict[_Key, dict[str, Any]] = {}
    for report in world["ranks"]:
        for finding in report.get("findings", []):
            seen.setdefault(_key(finding), finding)
    if seen:
        console.print(Text("findings by rank (a sync on some ranks only: the others wait for it at their next "
                           "collective):"))
    for finding in seen.values():
        counts = ", ".join(f"rank {i}: {'-' if n is None else f'{n:g}'}"
                           for i, n in enumerate(finding["per_step_by_rank"]))
        where = f"{Path(finding['path']).name}:{finding['line']}" if finding["path"] else "-"
        only = ""
        if "only_on_ranks" in finding:
            wait = finding["wait_on_other_ranks"]
            only = (f"; on rank(s) {', '.join(map(str, finding['only_on_ranks']))} only: the others wait for it, "
                    + (f"{wait:.3g} ms a step" if isinstance(wait, float) else wait))
        console.print(Text(f"  {where} {finding['rule']}: {finding['title']}: {counts} a step{only}"))

"""The doctor's piece of a budgeted GPU run: its planted training script under the doctor on the device (each
planted line's real syncs against its hazard count, their stalls, the copy bandwidth; "not measured: no GPU" off
one)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console

from pitfalls.doctor import checks, planted
from pitfalls.doctor.render import render
from pitfalls.doctor.report import DoctorReport

__all__ = ["gpu_check"]


def _real(report: DoctorReport, path: str, line: int) -> tuple[Any, Any]:
    if report.real_syncs is None:
        return f"not measured: {report.no_gpu}", f"not measured: {report.no_gpu}"
    for row in report.real_syncs:
        if (row.path, row.line) == (path, line):
            return row.real_per_step, round(row.stall_ms_per_step, 4)
    return 0.0, 0.0


def gpu_check(out_dir: Path, device: str) -> dict[str, Any]:
    """Run the planted training script under the doctor on ``device``; write its report; return its rows.

    Args:
        out_dir: where ``doctor.json`` (the report as `pitfalls doctor --json` prints it) and ``doctor.txt`` (as
            it prints it) are written; made if missing.
        device: "cuda" (every figure) or "cpu" (the GPU's cells read "not measured: no GPU").

    Returns:
        ``{"rows": [...], "agreement": ..., "bandwidth_gb_s": ..., "loader": ..., "steps": ...}``: one row per
        planted line with its planted syncs per step, the hazard count, the real syncs and the stall (ms a step).
    """
    report = checks.run_planted(device)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "doctor.json").write_text(json.dumps(report.as_json(), indent=2) + "\n")
    with (out / "doctor.txt").open("w") as text:
        render(report, Console(file=text, width=160, color_system=None))
    rows = []
    for name, line in (("item", checks.ITEM), ("nonzero", checks.NONZERO), ("helper", checks.HELPER),
                       ("tolist", checks.TOLIST), ("optimizer step", checks.OPTIMIZER)):
        number = checks.planted_line(line.text)
        real, stall = _real(report, str(planted.TRAIN), number)
        rows.append({"planted": name, "line": number, "planted_per_step": line.per_step,
                     "hazards_per_step": checks.syncs_at(report, line), "real_syncs_per_step": real,
                     "stall_ms_per_step": stall})
    loader = report.loader
    return {
        "device": device,
        "rows": rows,
        "agreement": (f"not measured: {report.no_gpu}" if report.syncs_agree is None else
                      "every line's real syncs equal its hazards" if report.syncs_agree else
                      "some line's real syncs differ from its hazards"),
        "bandwidth_gb_s": dict(report.bandwidth) if report.bandwidth else f"not measured: {report.no_gpu}",
        "loader": {"planted_ms": planted.BATCH * planted.ITEM_MS,
                   "measured_ms": None if loader is None else loader.ms_per_step,
                   "verdict": None if loader is None else loader.verdict},
        "steps": report.as_json()["steps"],
        "ended": report.ended,
        "wall_s": report.wall_s,
    }

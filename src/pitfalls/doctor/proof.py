"""The doctor's GPU checks, pieces of a budgeted GPU run: the planted scripts under the doctor on a device.

`gpu_check` runs the planted training script: on CUDA it reads what only a GPU can, each planted line's real syncs
(CUDA's sync debug mode) against its hazard count, what each sync stalled the step, and the copy bandwidth.
`rules_check` runs the planted rules script: on CUDA its autocast casts for the device and TF32 applies, so the
rules that need a GPU (a float32 matmul without TF32, a half-precision size not a multiple of 8) read there. On any
other device the same runs read the CPU's figures, and every GPU cell says "not measured: no GPU".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console

from pitfalls.doctor.render import render
from pitfalls.doctor.report import DoctorReport

__all__ = ["gpu_check", "rules_check"]


def _real(report: DoctorReport, path: str, line: int) -> tuple[Any, Any]:
    if report.real_syncs is None:
        return f"not measured: {report.no_gpu}", f"not measured: {report.no_gpu}"
    for row in report.real_syncs:
        if (row.path, row.line) == (path, line):
            return row.real_per_step, round(row.stall_ms_per_step, 4)
    return 0.0, 0.0


def _write(report: DoctorReport, out: Path, name: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(report.as_json(), indent=2) + "\n")
    with (out / f"{name}.txt").open("w") as text:
        render(report, Console(file=text, width=160, color_system=None))


def rules_check(out_dir: Path, device: str) -> dict[str, Any]:
    """Run the planted rules script under the doctor on ``device``; write its report; return its rows.

    Args:
        out_dir: where ``doctor-rules.json`` and ``doctor-rules.txt`` are written; made if missing.
        device: "cuda" or "cpu".

    Returns:
        ``{"device": ..., "rows": [...], "right_lines": ...}``: one row per planted rule (its line, 1 planted, the
        findings read there) and the findings on the right-thing lines (0 planted).
    """
    from pitfalls.doctor import known as planted

    report = planted.run_rules(device)
    _write(report, Path(out_dir), "doctor-rules")
    rows = [{"rule": one.name, "line": planted.lines_marked(one.text)[0], "planted": 1,
             "found": len(planted.at_planted(report, one))} for one in planted.PLANTED]
    right = planted.on_right_lines(report)
    return {"device": device, "rows": rows, "right_lines": {"planted": 0, "found": len(right),
                                                             "what": [f"line {f.line}: {f.title}" for f in right]},
            "ended": report.ended, "error": None if report.failure is None else report.failure.last_line}


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
    from pitfalls.doctor import known as planted

    report = planted.run_planted(device)
    _write(report, Path(out_dir), "doctor")
    rows = []
    for name, line in (("item", planted.ITEM), ("nonzero", planted.NONZERO), ("helper", planted.HELPER),
                       ("tolist", planted.TOLIST), ("optimizer step", planted.OPTIMIZER)):
        number = planted.planted_line(line.text)
        real, stall = _real(report, str(planted.PLANTED_SCRIPT), number)
        rows.append({"planted": name, "line": number, "planted_per_step": line.per_step,
                     "hazards_per_step": planted.syncs_at(report, line), "real_syncs_per_step": real,
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

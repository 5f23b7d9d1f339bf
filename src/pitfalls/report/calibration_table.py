"""The calibration table: every check of `pitfalls calibrate` with its tolerance, and the errors committed runs read
(the asv results' newest per check and machine, and every GPU run under ``proof/`` with calibration rows).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pitfalls.calibration.run import all_checks
from pitfalls.known.table import CUDA, Check
from pitfalls.markdown import code, table
from pitfalls.proofs import read_proofs
from pitfalls.registry import BUILTIN
from pitfalls.report.calibration_errors import FAIL, NA, PASS, CalibrationLine, calibration_table
from pitfalls.report.rows import Row

__all__ = ["calibration_lines", "suite_checks"]


def suite_checks() -> list[Check]:
    """The shared checks and the built-in families' own, in table order (a user's plug-in is not the suite's)."""
    builtin = {entry.name for entry in BUILTIN}
    return [check for check in all_checks() if not check.family or check.family in builtin]


def _amount(value: float, absolute: bool, unit: str) -> str:
    if not absolute:
        return f"{100 * value:.1f} %"
    return f"{value:.3g} " + ("points" if unit == "%" else unit)  # an absolute error in % is in points


def _tolerance(check: Check) -> str:
    if check.tolerance == 0:
        return "exact"
    return _amount(check.tolerance, True, check.unit) if check.absolute else f"{100 * check.tolerance:g} %"


def _published(line: CalibrationLine | None, check: Check | None) -> str:
    if line is None:
        return "-"
    if line.verdict == NA:
        return "n/a: no CUDA device" if check is not None and check.device == CUDA else f"n/a: {line.reason}"
    assert line.error is not None and check is not None  # judged lines carry their error and their check
    return f"{_amount(line.error, check.absolute, check.unit)} {line.verdict}"


def _from_run(row: dict[str, Any] | None, check: Check) -> str:
    if row is None:
        return "-"
    if row.get("error") is None:
        return f"{row['verdict']}: {row.get('reason', '')}".rstrip(": ")
    return f"{_amount(float(row['error']), check.absolute, check.unit)} {row['verdict']}"


def _outputs(proof: Path) -> dict[str, tuple[dict[str, dict[str, Any]], str]]:
    """Each committed GPU run's calibration rows: its folder under ``proof/`` -> (check name -> row, what wrote
    them: ``pitfalls calibrate --json`` outputs or a budgeted run's calibration piece)."""
    return {run.name: (rows, "`pitfalls calibrate --json`" if run.calibrate_outputs else "`scripts/gpu-run`")
            for run in read_proofs(proof) if (rows := run.calibration_rows())}


def calibration_lines(rows: Sequence[Row], proof: Path | None) -> list[str]:
    """The table: one line per check; a column per machine of the asv results and per committed calibrate output.

    A check the results hold that this version no longer has is listed last, its tolerance unknown.

    Args:
        rows: asv results' rows (only the calibration errors are read).
        proof: the folder of the GPU runs' outputs (None: none).
    """
    checks = suite_checks()
    published = calibration_table(rows, checks)
    by_key = {(line.check, line.machine): line for line in published}
    machines = sorted({line.machine for line in published if line.machine is not None})
    outputs = _outputs(proof) if proof is not None else {}
    known = {check.name for check in checks}
    gone = list(dict.fromkeys(line.check for line in published if line.check not in known))
    body = [[check.name, ", ".join(check.instruments), _tolerance(check),
             *(_published(by_key.get((check.name, m)), check) for m in machines),
             *(_from_run(found.get(check.name), check) for found, _ in outputs.values())] for check in checks]
    body += [[name, "-", "unknown: no such check in this version",
              *(_published(by_key.get((name, m)), None) for m in machines), *("-" for _ in outputs)] for name in gone]
    if not machines and not outputs:
        return table(("check", "calibrates", "tolerance"), body) + [
            "", "No run has measured these checks yet: `pitfalls calibrate` measures the table here, and an asv run "
            "of the suite at a commit with the calibration benchmarks publishes its shared checks."]
    lines = table(("check", "calibrates", "tolerance", *map(code, machines), *(f"`proof/{f}`" for f in outputs)),
                  body)
    commits = {m: sorted({line.commit[:8] for line in published if line.machine == m and line.commit})
               for m in machines}
    verdicts = [line.verdict for line in published if line.machine is not None]
    measured = sum(v in (PASS, FAIL) for v in verdicts)
    lines += ["", "Errors, each against the planted value: " + "; ".join(
        [f"{code(m)}, the newest asv figure of each check (commits {', '.join(map(code, commits[m]))})"
         for m in machines] + [f"`proof/{f}`, {made_by}" for f, (_, made_by) in outputs.items()]) + "."]
    if machines:
        lines += ["", f"In the asv results, {measured - verdicts.count(FAIL)} of {measured} measured checks within "
                      f"tolerance; {len(verdicts) - measured} n/a."]
    return lines

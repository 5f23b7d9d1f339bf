"""Each check's published error judged against this version's tolerance (docs/report.md, "Calibration"), and where
it came from: the lines of the calibration table, `pitfalls.report.calibration_table`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pitfalls.calibration.published import CHECK_PARAM, ERROR_METHOD, error_unit, published_checks
from pitfalls.known.table import CUDA, Check
from pitfalls.report.rows import FAILED, SKIPPED, Row, recency

__all__ = ["PASS", "FAIL", "NA", "CalibrationLine", "calibration_table", "is_calibration_error"]

FAMILY = "calibration"
PASS, FAIL, NA = "pass", "fail", "n/a"
@dataclass(frozen=True)
class CalibrationLine:
    """One row of the report's calibration table.

    Attributes:
        check: the check's name.
        machine: the asv machine the figure came from; None when the results hold no figure of the check.
        commit: the commit it was measured at; None with ``machine``.
        error: the published error; None when skipped, failed or absent.
        verdict: "pass", "fail" or "n/a".
        reason: why n/a (or how the figure was judged); "" for pass and fail.
    """

    check: str
    machine: str | None
    commit: str | None
    error: float | None
    verdict: str
    reason: str = ""


def is_calibration_error(row: Row) -> bool:
    """Whether an asv row is one check's published error."""
    return row.family == FAMILY and row.figure == ERROR_METHOD and CHECK_PARAM in row.params


def _judged(row: Row, check: Check | None) -> CalibrationLine:
    def line(verdict: str, reason: str = "") -> CalibrationLine:
        return CalibrationLine(check=str(row.params[CHECK_PARAM]), machine=row.machine, commit=row.commit,
                               error=row.value if row.measured else None, verdict=verdict, reason=reason)

    if check is None:
        return line(NA, "no such check in this version: its tolerance is unknown")
    if error_unit(check) != row.unit:
        return line(NA, f"measured in {row.unit!r}; this version's check reads {error_unit(check)!r}")
    if row.status == FAILED:
        return line(NA, "failed: the check raised an error there (no figure)")
    if row.status == SKIPPED or row.value is None:
        why = ("a CUDA check: it runs only where a CUDA device is present" if check.device == CUDA else
               "skipped there; asv keeps no reason (`asv run --show-stderr` prints it)")
        return line(NA, why)
    ok = row.value <= check.tolerance if check.tolerance else row.value == 0
    return line(PASS if ok else FAIL)


def calibration_table(rows: Sequence[Row], checks: Sequence[Check]) -> list[CalibrationLine]:
    """One line per check and machine: the newest published error of the check there, judged by its tolerance.

    Args:
        rows: the report's rows (any family; only the calibration errors are read).
        checks: this version's checks, in table order.

    Returns:
        The lines, in the checks' order (checks the results hold but this version lacks last), machines sorted; a
        check without a figure on any machine has one n/a line. Empty when the rows hold no calibration error.
    """
    errors = [r for r in rows if is_calibration_error(r)]
    if not errors:
        return []
    by_name = {c.name: c for c in published_checks(checks)}
    published = dict.fromkeys(str(r.params[CHECK_PARAM]) for r in errors)
    names = list(by_name) + [n for n in published if n not in by_name]
    lines = []
    for name in names:
        mine = [r for r in errors if r.params[CHECK_PARAM] == name]
        if not mine:
            lines.append(CalibrationLine(check=name, machine=None, commit=None, error=None, verdict=NA,
                                         reason="no figure of this check in these results"))
            continue
        for machine in sorted({r.machine for r in mine}):
            lines.append(_judged(max((r for r in mine if r.machine == machine), key=recency), by_name.get(name)))
    return lines

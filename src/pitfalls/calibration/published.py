"""The calibration table as asv publishes it: one series per check, holding the error `verdict` computes, one
benchmark class per unit of error (docs/methodology.md, "Over commits, in the asv site").
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from pitfalls.known.table import CPU, CUDA, Check
from pitfalls.result import Unavailable

__all__ = ["CHECK_PARAM", "ERROR_METHOD", "RELATIVE", "check_named", "checks_by_error_unit", "error_class_name",
           "error_unit", "measured_error", "published_checks"]

# The benchmark method, and its one parameter, that publish a check's error.
ERROR_METHOD = "track_error"
CHECK_PARAM = "check"
# The unit of a relative error (0.05 is 5 % of the planted value).
RELATIVE = "relative"


def error_unit(check: Check) -> str:
    """The unit of a check's error: ``RELATIVE``, or the check's own unit where its tolerance is absolute."""
    return check.unit if check.absolute else RELATIVE


def published_checks(checks: Iterable[Check]) -> list[Check]:
    """The checks whose error asv publishes over commits: the shared instruments', which every family's figures read
    (a family's own checks and the doctor's are not: docs/methodology.md, "Over commits, in the asv site")."""
    return [check for check in checks if check.published and not check.family]


def checks_by_error_unit(checks: Iterable[Check]) -> dict[str, list[str]]:
    """The published checks' names grouped by the unit of their error, groups in first-seen order (relative first).

    Args:
        checks: the checks, in table order; those not published (`Check.published`) are left out.

    Returns:
        ``{error unit: [check name, ...]}``; every published check appears once.
    """
    grouped: dict[str, list[str]] = {RELATIVE: []}
    for check in published_checks(checks):
        grouped.setdefault(error_unit(check), []).append(check.name)
    return {unit: names for unit, names in grouped.items() if names}


def error_class_name(unit: str) -> str:
    """The asv class that publishes the errors in ``unit``: "Error" for relative ones, "ErrorIn<Unit>" otherwise."""
    if unit == RELATIVE:
        return "Error"
    words = "".join(ch if ch.isalnum() else " " for ch in unit.replace("%", " percent ")).split()
    return "ErrorIn" + "".join(word.capitalize() for word in words)


def check_named(name: str, checks: Sequence[Check]) -> Check:
    """The check called ``name``; a ValueError naming the allowed names when none is."""
    for check in checks:
        if check.name == name:
            return check
    raise ValueError(f"check {name!r} is not a calibration check; allowed: {', '.join(c.name for c in checks)}")


def measured_error(name: str, device: str, checks: Sequence[Check] | None = None) -> float | Unavailable:
    """Run one check as `pitfalls calibrate` runs it and return its error, or why it could not be read here.

    Args:
        name: the check's name.
        device: "cpu" (a CUDA check is not run) or "cuda".
        checks: where to look the name up; None means every check (`run.all_checks`).

    Returns:
        The row's ``error`` as `verdict` computes it (whatever the verdict), or `Unavailable` with the row's reason.
    """
    from pitfalls.calibration import run  # run imports every family; published is imported by the report too

    if device not in (CPU, CUDA):
        raise ValueError(f"device={device!r} is not allowed; allowed: {CPU}, {CUDA}")
    check = check_named(name, run.all_checks() if checks is None else checks)
    row = run.run_checks([check], device)[0]
    if row.error is None:
        return Unavailable(row.reason or f"{name}: not run")
    return row.error


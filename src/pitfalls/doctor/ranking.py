"""One order for the findings: by what each costs a step.

Findings whose cost was measured come first, the costliest first; those whose cost could not be measured (a sync
on a CPU: "cost not measurable on a CPU") follow, by how often they happen per step. One-off costs are not
findings and are never ranked.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from pitfalls.doctor.report import Finding

__all__ = ["explained_share", "rank"]


def _order(finding: Finding) -> tuple[int, float, str, int]:
    if finding.ms_per_step is not None:
        return 0, -finding.ms_per_step, finding.path or "", finding.line or 0
    per_step = finding.per_step if finding.per_step is not None else -1.0
    return 1, -per_step, finding.path or "", finding.line or 0


def rank(findings: Iterable[Finding], step_ms: float | None) -> tuple[Finding, ...]:
    """Order findings by cost and number them, each with its share of the step.

    Args:
        findings: the findings, in any order.
        step_ms: the mean step time (None when no step was timed: no share is given); the mean, so that the
            loader's share is its wait share, the wait over the time of the timed steps.

    Returns:
        The findings, ranked from 1.
    """
    ordered = sorted(findings, key=_order)
    return tuple(
        dataclasses.replace(
            finding, rank=position,
            share_of_step=(finding.ms_per_step / step_ms
                           if finding.ms_per_step is not None and step_ms else None),
        )
        for position, finding in enumerate(ordered, start=1)
    )


def explained_share(findings: Iterable[Finding], step_ms: float | None) -> float | None:
    """The share of the mean step that the findings with a measured cost add up to (None: no step timed)."""
    if not step_ms:
        return None
    return sum(f.ms_per_step for f in findings if f.ms_per_step is not None) / step_ms

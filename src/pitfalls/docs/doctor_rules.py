"""The doctor's rules table: each rule, what it finds, its fix, whose rule it is, where the doctor reads it."""

from __future__ import annotations

from pitfalls.doctor.rules import RULES
from pitfalls.markdown import table

__all__ = ["rules_lines"]


def rules_lines() -> list[str]:
    """One line per rule of `pitfalls.doctor.rules.RULES`, in its order."""
    return table(("rule", "finds", "fix", "source", "read on"),
                 ((rule.name, rule.finds, rule.fix, rule.source, rule.where) for rule in RULES))

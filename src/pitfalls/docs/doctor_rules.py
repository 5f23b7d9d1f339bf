"""The doctor's rules table: each built-in rule of the registry, what it finds, its fix, whose rule it is, what it
reads, and its plant."""

from __future__ import annotations

from pitfalls.doctor.rule import ScriptLine
from pitfalls.doctor.rules import BUILTIN
from pitfalls.markdown import table

__all__ = ["rules_lines"]


def _line(line: ScriptLine) -> str:
    return f"{line.script.name}:{line.number}"


def rules_lines() -> list[str]:
    """One line per built-in rule of `pitfalls.doctor.rules`, in its order."""
    return table(("rule", "kind", "finds", "fix", "source", "reads", "planted, twin"),
                 ((r.name, r.kind, r.finds, r.fix, r.source, f"{r.reads} ({r.where})",
                   f"{_line(r.plant.planted)}, {_line(r.plant.right)}") for r in BUILTIN))

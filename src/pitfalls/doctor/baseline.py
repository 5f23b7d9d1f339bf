"""A gate for a whole training script (``--save-baseline``, ``--baseline``): what a run found, saved, and a later run
checked against it, lines matched by their file, function and code (docs/doctor.md, "--baseline").
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from linecache import getline
from pathlib import Path
from typing import Any

from pitfalls.doctor import rules
from pitfalls.doctor.report import DoctorReport
from pitfalls.probes.sites import function_at

__all__ = ["FORMAT", "SCRIPT", "BaselineError", "Change", "Comparison", "compare", "entries", "load", "save"]

FORMAT = "pitfalls doctor baseline 1"
SCRIPT = "<script>"
# Counts per step are ratios of whole counts over the scanned steps: equal ones compare equal, up to rounding.
_SAME = 1e-9


# What a baseline entry is, whatever its line number: its kind, what, file, function and code.
_FIELDS = ("kind", "what", "file", "function", "code")
_Key = tuple[str, str, str, str, str]

class BaselineError(ValueError):
    """A baseline file that cannot be read or written: one line, exit 2."""


@dataclass(frozen=True)
class Change:
    """One difference between the baseline and the run.

    Attributes:
        kind: "sync", "copy", "graph break" or "rule".
        what: the op, the copy, the break's reason or the rule's name.
        file: ``<script>``, or a path (from the script's folder where it lies inside it).
        line: its number in this run (None for what was removed).
        before: its count per step in the baseline (None: absent, or a graph break, which has no count).
        after: its count per step now (None: removed, or a graph break).
    """

    kind: str
    what: str
    file: str
    function: str
    code: str
    line: int | None
    before: float | None
    after: float | None

    def sentence(self) -> str:
        """The change in one line."""
        where = f"{self.file}:{self.line}" if self.line is not None else self.file
        counts = ""
        if self.before is not None and self.after is not None:
            counts = f" ({self.before:g} -> {self.after:g} a step)"
        elif self.after is not None:
            counts = f" ({self.after:g} a step)"
        elif self.before is not None:
            counts = f" (was {self.before:g} a step)"
        return f"{self.kind} {self.what} at {where} in {self.function}: {self.code}{counts}"


@dataclass(frozen=True)
class Comparison:
    """The run against the baseline file: the lines, graph breaks and rules that are new (``added``) or that the run
    no longer has (``removed``), and the lines whose count per step grew or shrank."""

    file: str
    added: tuple[Change, ...]
    grew: tuple[Change, ...]
    removed: tuple[Change, ...]
    shrank: tuple[Change, ...]

    @property
    def failed(self) -> bool:
        """Whether the gate fails: something new, or a count that grew."""
        return bool(self.added or self.grew)

    def as_json(self) -> dict[str, Any]:
        """The comparison as the JSON report's ``baseline`` entry."""
        return {"file": self.file, "failed": self.failed,
                **{name: [vars(c) for c in getattr(self, name)] for name in ("added", "grew", "removed", "shrank")}}


def _file(path: str | None, script: str) -> str:
    if path is None:
        return ""
    if os.path.realpath(path) == os.path.realpath(script):
        return SCRIPT
    folder = Path(script).resolve().parent
    resolved = Path(path).resolve()
    return resolved.relative_to(folder).as_posix() if resolved.is_relative_to(folder) else path


def entries(report: DoctorReport) -> dict[_Key, tuple[int | None, float | None]]:
    """What a run found, by key: (a line, the count per step, summed over identical lines; None for a break): the
    findings of the rules whose counts are exact on a CPU (`rule.Rule.gated`), the copies and the graph breaks."""
    found: dict[_Key, tuple[int | None, float | None]] = {}

    def add(kind: str, what: str, path: str | None, function: str, code: str, line: int | None,
            count: float | None) -> None:
        key = (kind, what, _file(path, report.script), function, code)
        if key in found:
            first, total = found[key]
            found[key] = (first, None if count is None or total is None else total + count)
        else:
            found[key] = (line, count)

    for f in report.findings:
        gated = rules.rule(f.rule)
        if gated is not None and gated.gated:
            function = f.function or (function_at(f.path, f.line) if f.path and f.line else "")
            add(f.kind, f.title if f.kind == "sync" else f.rule, f.path, function, f.code, f.line, f.per_step or 0.0)
    for c in report.copies:
        what = f"{c.call} {c.direction}, {'pinned' if c.pinned else 'pageable'}, " \
               f"{'blocking' if c.blocking else 'non-blocking'}"
        add("copy", what, c.path, c.function, c.code, c.line, c.per_step)
    for b in report.compile.graph_breaks:
        add("graph break", b.reason, b.path, function_at(b.path, b.line), getline(b.path, b.line).strip(), b.line, None)
    return found


def save(report: DoctorReport, path: Path) -> None:
    """Write a run's baseline to ``path``.

    Raises:
        BaselineError: the file cannot be written.
    """
    rows = [{**dict(zip(_FIELDS, key, strict=True)), "per_step": count}
            for key, (_line, count) in sorted(entries(report).items())]
    data = {"format": FORMAT, "scanned_steps": report.steps.scanned, "entries": rows}
    try:
        path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    except OSError as error:
        raise BaselineError(f"--save-baseline {str(path)!r} cannot be written: {error.strerror}") from None


def load(path: Path) -> dict[_Key, float | None]:
    """Read a baseline file.

    Raises:
        BaselineError: the file is missing, unreadable, or not a baseline this command wrote.
    """
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise BaselineError(f"--baseline {str(path)!r} cannot be read: {error.strerror}; give a file "
                            "`pitfalls doctor --save-baseline` wrote") from None
    except ValueError:
        data = None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("entries"), list):
        raise BaselineError(f"--baseline {str(path)!r} is not a baseline ({FORMAT!r}); give a file "
                            "`pitfalls doctor --save-baseline` wrote")
    saved: dict[_Key, float | None] = {}
    for row in data["entries"]:
        try:
            saved[tuple(row[name] for name in _FIELDS)] = row["per_step"]
        except (KeyError, TypeError):
            raise BaselineError(f"--baseline {str(path)!r} has an entry without kind, what, file, function, code "
                                f"and per_step: {row!r}") from None
    return saved


def compare(saved: dict[_Key, float | None], report: DoctorReport, file: str) -> Comparison:
    """The run against a baseline: what was added, grew, was removed or shrank."""
    now = entries(report)
    added, grew, removed, shrank = [], [], [], []
    for key, (line, count) in now.items():
        change = Change(*key, line=line, before=saved.get(key), after=count)
        if key not in saved:
            added.append(change)
        elif count is not None and saved[key] is not None:
            before = float(saved[key] or 0.0)
            if count > before + _SAME:
                grew.append(change)
            elif count < before - _SAME:
                shrank.append(change)
    for key, count in saved.items():
        if key not in now:
            removed.append(Change(*key, line=None, before=count, after=None))
    return Comparison(file, tuple(added), tuple(grew), tuple(removed), tuple(shrank))

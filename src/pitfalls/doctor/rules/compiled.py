"""torch.compile's rules, read by the suite's one compile instrument over the whole run
(`pitfalls.probes.compiled.CompileWatch`): each graph break at its line, each frame compiled again in the timed steps.
"""

from __future__ import annotations

from linecache import getline

from pitfalls.doctor.planted import RULES as SCRIPT
from pitfalls.doctor.reasons import NO_BREAK_COST
from pitfalls.doctor.records import Seen
from pitfalls.doctor.rule import Hit, Plant, Rule
from pitfalls.probes.compiled import Recompile
from pitfalls.probes.sites import SourceLine, function_at, functions

__all__ = ["GRAPH_BREAK", "RECOMPILE", "RULES"]

_READS = "torch.compile's instrument over the run (dynamo's graph-break log and compilation metrics)"


def _line(path: str, line: int) -> SourceLine:
    return SourceLine(path, line, function_at(path, line), getline(path, line).strip())


def _first_line(recompile: Recompile) -> SourceLine | None:
    """The line that defines the function compiled again (the first of that name in its file), or None."""
    found = [first for first, _last, name in functions(recompile.path) if name == recompile.function]
    return _line(recompile.path, found[0]) if found else None


def _breaks(seen: Seen) -> list[Hit]:
    return [Hit(f"graph break: {b.reason}" + (f" (dynamo's hint: {b.hint})" if b.hint else ""), _line(b.path, b.line),
                None, cost=f"not measured: {NO_BREAK_COST}") for b in seen.graph_breaks]


def _recompiles(seen: Seen) -> list[Hit]:
    timed = seen.timed
    if timed is None or not timed.step_s:
        return []
    steps = len(timed.step_s)
    during: dict[tuple[str, str, str], list[Recompile]] = {}
    for r in seen.recompiles:
        if timed.during(r.started):
            during.setdefault((r.function, r.path, r.reason), []).append(r)
    return [Hit(f"recompile of {function}: {reason}", _first_line(group[0]),
                len(group) / steps, sum(r.seconds for r in group) * 1e3 / steps,
                "measured: compile seconds during the timed steps")
            for (function, _path, reason), group in during.items()]


GRAPH_BREAK = Rule(
    "graph break", "compile",
    "a line dynamo cannot trace: torch.compile splits the function there and runs the line in Python",
    "rewrite the line so dynamo can trace it (dynamo's hint, in the finding, says how), or move it out of the "
    "compiled function", "dynamo's graph_breaks log (TORCH_LOGS=graph_breaks)", _READS, _breaks,
    Plant.of(SCRIPT, "torch._dynamo.graph_break()", "return x * 2.0 + 1.0"))
RECOMPILE = Rule(
    "recompile", "compile",
    "a compiled frame compiled again during the timed steps: a guard failed (a new shape, dtype or global state)",
    "give the changing size one value (pad or drop the last partial batch), or compile it dynamic: "
    "torch._dynamo.mark_dynamic(x, dim) or torch.compile(..., dynamic=True)",
    "dynamo's compilation metrics (recompile_reason)", _READS, _recompiles,
    Plant.of(SCRIPT, "def reshaped(x: torch.Tensor)", "def same_shape(x: torch.Tensor)"))
RULES = (GRAPH_BREAK, RECOMPILE)

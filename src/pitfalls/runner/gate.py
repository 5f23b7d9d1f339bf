"""Which families the main job's equivalence gate proves: those whose benchmarks the run can select.

asv selects benchmarks by regular expressions (``-b``) searched in their names, ``bench_<family>.<Class>.<method>``
for a family's own module. A run limited to one family's benchmarks needs only that family proved before it is
measured; any other expression, or none, may select any benchmark, so then every family is proved.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

__all__ = ["gated_families"]

# The plugin families' benchmarks live in one module for all of them: it names no family of its own.
PLUGINS_MODULE = "bench_plugins"
# A literal module name at the start of an expression, then the end or the dot before its class (escaped or not:
# an unescaped dot there can match only a character of a module that does not exist, which is checked below).
_LEADING_MODULE = re.compile(r"\^?(bench_\w+?)(?:\\\.|\.|\$|$)")


def _selections(asv_args: Sequence[str]) -> list[str] | None:
    """The ``-b``/``--bench`` expressions of ``asv run`` arguments; None where one is given in a form not read here."""
    found: list[str] = []
    args = list(asv_args)
    for index, arg in enumerate(args):
        if arg in ("-b", "--bench"):
            if index + 1 == len(args):
                return None
            found.append(args[index + 1])
        elif arg.startswith("--bench="):
            found.append(arg.removeprefix("--bench="))
        elif arg.startswith("-b") and not arg.startswith("--"):
            return None
    return found


def gated_families(asv_args: Sequence[str], benchmark_dir: Path) -> tuple[str, ...] | None:
    """The families whose benchmarks a main job with these ``asv run`` arguments can run, or None for all.

    Args:
        asv_args: the job's extra ``asv run`` arguments.
        benchmark_dir: the asv benchmark folder (its ``bench_<family>.py`` modules).

    Returns:
        Family names in the order the expressions give them, or None: prove every family.
    """
    selections = _selections(asv_args)
    if not selections:
        return None
    modules = {path.stem for path in benchmark_dir.glob("bench_*.py")} - {PLUGINS_MODULE}
    families: list[str] = []
    for expression in selections:
        found = _LEADING_MODULE.match(expression)
        if found is None or found[1] not in modules:
            return None
        module = found[1]
        # "bench_loss." would also be searched in a module bench_loss_x: only where no such module exists is the
        # expression one family's.
        if any(other != module and other.startswith(module) for other in modules):
            return None
        families.append(module.removeprefix("bench_"))
    return tuple(dict.fromkeys(families))

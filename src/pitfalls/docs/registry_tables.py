"""Tables that restate the registry: the families, each family's parameters and grids, and its asv benchmarks."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pitfalls.asv_files import SUITE_API, read_json
from pitfalls.family import FLOOR, Family, Param
from pitfalls.markdown import code, link, table
from pitfalls.registry import BUILTIN
from pitfalls.report.loading import ASV_KINDS

__all__ = ["benchmark_lines", "builtin_family", "families_lines", "family_lines"]

def builtin_family(name: str) -> Family:
    """A built-in family by name (a user's plug-ins are not the suite's to document).

    Raises:
        ValueError: no built-in family has that name (the message lists them).
    """
    for entry in BUILTIN:
        if entry.name == name:
            return entry
    raise ValueError(f"family {name!r} is not built in; built in: {', '.join(f.name for f in BUILTIN)}")


def families_lines(page: Path) -> list[str]:
    """One line per built-in family (linked to its page): its article, variants (naive first), floor and what it
    shows."""
    return table(
        ("family", "article", "variants (naive first)", "floor", "the pitfall"),
        ((link(f.name, Path("docs") / "families" / f"{f.name}.md", page), f.article, ", ".join(map(code, f.variants)),
          code(FLOOR) if f.floor else "none", f.summary) for f in BUILTIN))


def _allowed(param: Param) -> str:
    if param.choices:
        return ", ".join(map(str, param.choices))
    if param.kind is bool:
        return "true, false"
    return f"int >= {param.minimum}" if param.kind is int else "any"


def _sizes(sizes: Mapping[str, Any]) -> str:
    return ", ".join(f"{name}={value}" for name, value in sizes.items())


def family_lines(entry: Family) -> list[str]:
    """A family's variants, figures, parameters with defaults, grids and sizes, as its entry holds them."""
    floor = f"; then {code(FLOOR)}, the reference case the gate does not apply to" if entry.floor else "; no floor"
    lines = [
        f"Variants, naive first: {', '.join(map(code, entry.variants))}{floor}. One call is one {entry.unit}; "
        f"the figures that apply: {', '.join(sorted(entry.figures))}.",
        "",
        *table(("parameter", "flag", "type", "default", "allowed", "meaning"),
               ((code(p.name), code(p.flag), p.type_name, "derived" if p.default is None else code(p.default),
                 _allowed(p), p.help) for p in entry.params)),
        "",
    ]
    grids = list(entry.grids)
    lines += table(("grid axis", *grids),
                   ((code(name), *(", ".join(map(str, entry.grids[g][name])) for g in grids))
                    for name in entry.grids["quick"]))
    lines += ["", f"Smoke size (`pitfalls check`, the tests): {_sizes(entry.smoke)}."]
    if entry.article_sizes:
        lines.append("The articles' sizes (the GPU runs): " + "; ".join(_sizes(s) for s in entry.article_sizes) + ".")
    return lines


def benchmark_lines(family: str, description: Path) -> list[str]:
    """The asv benchmarks of a family as the committed suite description (``results/benchmarks.json``) has them."""
    described = read_json(description, SUITE_API)
    prefix = f"bench_{family}."
    mine = [b for name, b in described.items() if name.startswith(prefix) and isinstance(b, dict)]
    if not mine:
        raise ValueError(f"{description} describes no benchmark of family {family!r} ({prefix}*)")
    return table(("benchmark", "kind", "unit", "axes"),
                 ((code(b["name"].removeprefix(prefix)), ASV_KINDS.get(b["type"], b["type"]), b["unit"],
                   ", ".join(b["param_names"])) for b in sorted(mine, key=lambda b: b["name"])))

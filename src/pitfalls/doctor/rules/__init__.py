"""The one registry of the doctor's rules: the built-in ones, then those other packages register through the
entry-point group ``pitfalls.rules`` or ``PITFALLS_RULES=path/to/file.py:NAME`` (or ``module:NAME``), as families
are; a rule that fails to load is left out with a warning, `load_errors` says why (docs/extending.md, "Your own rule").
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from pitfalls._import import registered
from pitfalls.doctor.records import ScanContext, Seen
from pitfalls.doctor.report import Finding
from pitfalls.doctor.rule import Rule
from pitfalls.doctor.rules import compiled, copies, loader, model, settings, syncs, training

__all__ = ["BUILTIN", "ENTRY_POINT_GROUP", "RULES_ENV", "all_rules", "findings", "instruments", "load_errors",
           "reload", "rule", "watches"]

ENTRY_POINT_GROUP = "pitfalls.rules"
RULES_ENV = "PITFALLS_RULES"
# In the order ties between findings of equal cost keep in the report.
BUILTIN: tuple[Rule, ...] = (*loader.RULES[:2], *syncs.RULES, *copies.RULES, *compiled.RULES, loader.WIDE,
                             *model.RULES, *training.RULES, *settings.RULES)


@functools.cache
def _registry() -> tuple[dict[str, Rule], tuple[str, ...]]:
    return registered(BUILTIN, Rule, ENTRY_POINT_GROUP, RULES_ENV)


def reload() -> None:
    """Forget the loaded rules, so the next call reads the entry points and the environment again."""
    _registry.cache_clear()


def all_rules() -> tuple[Rule, ...]:
    """Every registered rule: the built-ins first, then the plug-ins."""
    return tuple(_registry()[0].values())


def load_errors() -> tuple[str, ...]:
    """Why each registered rule that failed to load was left out."""
    return _registry()[1]


def rule(name: str) -> Rule | None:
    """The rule of that name, or None."""
    return _registry()[0].get(name)


def instruments() -> tuple[Callable[[ScanContext], AbstractContextManager[Any]], ...]:
    """The instruments the rules need in the scanned steps, each once, in the order of the rules that need them."""
    return tuple(dict.fromkeys(r.instrument for r in all_rules() if r.instrument is not None))


def watches() -> tuple[Callable[[], AbstractContextManager[Any]], ...]:
    """The watches of the whole run the rules need, each once, in the order of the rules that need them."""
    return tuple(dict.fromkeys(r.watch for r in all_rules() if r.watch is not None))


def findings(seen: Seen) -> list[Finding]:
    """Every rule's findings in a run, in the rules' order."""
    return [finding for one in all_rules() for finding in one.findings(seen)]

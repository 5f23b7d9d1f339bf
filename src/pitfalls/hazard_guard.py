"""A guard for tests: fail when a block dispatches a sync hazard, naming the source line of each (docs/scan.md).

On a clean exit any hazard not allowed raises `SyncHazardError`, an AssertionError, so a test framework reports it
as a failure.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import PurePath

from pitfalls.probes.rewrites import describe
from pitfalls.probes.sites import CallSite, HazardLocator, HazardSite, LocatedHazards

__all__ = ["SyncHazardError", "SyncHazardGuard", "no_sync_hazards", "shown_call_sites"]


def shown_call_sites(site: HazardSite) -> tuple[CallSite, ...]:
    """The call sites worth naming under a hazard: those of a line reached from more than one caller line."""
    calls = tuple(call for call in site.call_sites if call.frames)
    return calls if len({call.frames[0] for call in calls}) > 1 else ()


class SyncHazardError(AssertionError):
    """A guarded block dispatched sync hazards that were not allowed; `sites` lists them with their lines."""

    def __init__(self, sites: tuple[HazardSite, ...]) -> None:
        self.sites = sites
        total = sum(site.count for site in sites)
        lines = [f"{total} sync hazard{'s' if total != 1 else ''} in the guarded block:"]
        for site in sites:
            where = site.line.short_where() if site.line else "(no frame outside torch)"
            code = f": {site.line.code}" if site.line and site.line.code else ""
            lines.append(f"  {where}: {site.kind.op} x{site.count}{code}")
            for call in shown_call_sites(site):  # a shared helper: name the lines that called it
                caller = call.frames[0]
                lines.append(f"      called from {caller.short_where()} x{call.count}: {caller.code}")
            lines.append(f"      rewrite: {site.kind.rewrite}")
        lines.append(
            "allow one with no_sync_hazards(allow={...}) by its op as printed, 'FILE:LINE' or 'FILE:FUNCTION'"
        )
        super().__init__("\n".join(lines))


def _matches_location(entry: str, site: HazardSite) -> bool:
    if site.line is None:
        return False
    file, _, where = entry.rpartition(":")
    if not file:
        file, where = entry, ""
    wanted = PurePath(file).parts
    path = PurePath(site.line.path).parts
    if not wanted or path[-len(wanted):] != wanted:
        return False
    if not where:
        return True
    return site.line.lineno == int(where) if where.isdigit() else site.line.function == where


def _allowed(entry: str, site: HazardSite) -> bool:
    ops = {site.kind.op, describe(site.label).op, site.label, site.label.removesuffix(".default")}
    return entry in ops or _matches_location(entry, site)


class SyncHazardGuard:
    """The context manager `no_sync_hazards` returns; `.result` holds everything seen, allowed or not."""

    def __init__(self, allow: Iterable[str] = ()) -> None:
        if isinstance(allow, str):
            raise TypeError(f"allow must be a collection of strings, e.g. {{{allow!r}}}, not the string {allow!r}")
        entries = tuple(allow)
        bad = [entry for entry in entries if not isinstance(entry, str) or not entry]
        if bad:
            raise TypeError(f"allow entries must be non-empty strings (an op, 'FILE:LINE', 'FILE:FUNCTION'), "
                            f"got {bad!r}")
        self.allow = frozenset(entries)
        self._locator = HazardLocator()
        self.result: LocatedHazards | None = None

    def __enter__(self) -> SyncHazardGuard:
        self.result = None
        self._locator.__enter__()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        __tracebackhide__ = True  # pytest shows the user's `with` line, not this frame
        self._locator.__exit__()
        self.result = self._locator.result
        if exc_type is not None:
            return  # the block's own error says more than its hazards
        found = tuple(site for site in self.result.sites if not any(_allowed(e, site) for e in self.allow))
        if found:
            raise SyncHazardError(found)


def no_sync_hazards(allow: Iterable[str] = ()) -> SyncHazardGuard:
    """Fail the block if it dispatches a sync hazard that is not allowed.

    Args:
        allow: hazards to let through, each one of: an op as the report prints it ("aten.nonzero",
            "boolean-mask index", ".item()") or its ATen label ("aten.nonzero.default"); "FILE:LINE" or
            "FILE:FUNCTION", where FILE is the end of the path ("loss.py", "mypkg/loss.py"); or "FILE".

    Returns:
        A context manager; on a clean exit it raises `SyncHazardError` listing each hazard not allowed with its
        source line, op, count and rewrite. Its `.result` holds every hazard seen.
    """
    return SyncHazardGuard(allow)

"""Guarded series versions: a pinned asv version holds only while the method behind it is unchanged.

asv draws one series per benchmark for as long as its ``version`` is unchanged, and by default that version is
a hash of the benchmark's own source (its method, ``setup`` and ``setup_cache``: asv_runner's ``Benchmark.code``).
The suite pins some versions (``benchmarks/series.json``) so that moving code onto shared bases kept the history.
A pin hides every later change of method, and asv's hash never covered the helpers a method calls anyway. So
next to each pin this module records a *method hash*: asv's code of the benchmark, plus the source of every
helper it reaches in the benchmark package, ``pitfalls.measure`` and ``pitfalls.probes``, plus the family's
own module. A test
recomputes it; any drift must be answered by one command, either

    scripts/series restart NAME --commit C --why "..."   (a new version: the series restarts), or
    scripts/series record NAME                              (the measurement did not change: new hash only).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect
import json
import pkgutil
import sys
import types
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asv_runner._aux import update_sys_path
from asv_runner.benchmarks._base import code_fingerprint
from asv_runner.discovery import disc_benchmarks

from pitfalls.checkout import ROOT, NoCheckout, require_checkout

BENCHMARKS = ROOT / "benchmarks"
PINS_FILE = BENCHMARKS / "series.json"
COMMAND = "scripts/series"
# Modules whose functions count as the figure code a benchmark reaches (besides the benchmark package itself).
FIGURE_PACKAGES = ("pitfalls.probes", "pitfalls.measure")


@dataclass(frozen=True)
class Pin:
    """One pinned series: the asv version it keeps, the method hash recorded with it, and its restarts.

    Attributes:
        version: the asv ``version`` the benchmark carries in every results file of its series.
        method: the method hash (see `method_hash`) recorded when the pin was last checked.
        restarts: each restart of the series: {"commit": the first results commit measured with the new method,
            "previous": the version it replaced (results made before carry it), "why": what changed}.
    """

    version: str
    method: str
    restarts: tuple[dict[str, str], ...] = ()


def load_pins(path: Path | None = None) -> dict[str, Pin]:
    """Read the pinned series, by benchmark name (``bench_loss.Compile.track_compile_seconds``).

    Args:
        path: the pins file; None means `PINS_FILE`.

    Returns:
        ``{name: Pin}``.
    """
    raw = json.loads((path or PINS_FILE).read_text())
    return {name: Pin(entry["version"], entry["method"], tuple(entry.get("restarts", ())))
            for name, entry in raw.items()}


def save_pins(pins: dict[str, Pin], path: Path | None = None) -> None:
    """Write the pinned series (to `PINS_FILE` unless ``path``), sorted by name, one entry per benchmark."""
    raw = {name: {k: v for k, v in dataclasses.asdict(pin).items() if v or k != "restarts"}
           for name, pin in sorted(pins.items())}
    (path or PINS_FILE).write_text(json.dumps(raw, indent=2) + "\n")


def _code_objects(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_objects(const)


def _in_modules(name: str, modules: tuple[str, ...]) -> bool:
    return any(name == m or name.startswith(m + ".") for m in modules)


def _functions_of(obj: Any) -> Iterator[types.FunctionType]:
    obj = getattr(obj, "__func__", obj)  # asv's benchmarks are bound methods
    if isinstance(obj, types.FunctionType):
        yield obj
    elif inspect.isclass(obj):
        for value in vars(obj).values():
            value = getattr(value, "__func__", value)  # classmethod, staticmethod
            if isinstance(value, types.FunctionType):
                yield value


def reached(functions: Iterable[Any], modules: tuple[str, ...], owners: tuple[type, ...] = ()) -> list[Any]:
    """Every function and class of ``modules`` that ``functions`` reach by name, transitively, in a stable order.

    A name is resolved in the calling function's globals; a module of ``modules`` found there also resolves the
    attribute names the same code uses (``registry.baseline`` reaches ``baseline``).

    Args:
        functions: where to start (a benchmark's method, setups, setup_cache).
        modules: module names (and their submodules) whose objects count.
        owners: classes whose attributes the same names also resolve (methods called on ``self``).

    Returns:
        The reached objects, each once, starting ones excluded.
    """
    start = [f for f in functions if f is not None]
    seen: dict[int, Any] = {}
    todo = [fn for f in start for fn in _functions_of(f)]
    done: set[int] = set()
    while todo:
        fn = todo.pop()
        if id(fn.__code__) in done:
            continue
        done.add(id(fn.__code__))
        names = {n for code in _code_objects(fn.__code__) for n in code.co_names}
        found = [fn.__globals__[n] for n in names if n in fn.__globals__]
        found += [getattr(getattr(owner, n), "__func__", getattr(owner, n)) for owner in owners for n in names
                  if hasattr(owner, n)]
        for value in list(found):
            if isinstance(value, types.ModuleType) and _in_modules(value.__name__, modules):
                found += [getattr(value, n) for n in names if hasattr(value, n)]
        for value in found:
            if (isinstance(value, types.FunctionType) or inspect.isclass(value)) and _in_modules(
                    value.__module__ or "", modules):
                seen.setdefault(id(value), value)
                todo.extend(_functions_of(value))
    return sorted(seen.values(), key=lambda o: (o.__module__, o.__qualname__))


def family_modules(family: str) -> list[types.ModuleType]:
    """The family's own modules: where its builder is defined, or the whole package named after the family that
    holds it (``pitfalls.families.loader`` for a builder in ``pitfalls.families.loader.entry``)."""
    from pitfalls import registry

    root = registry.family(family).builder.__module__
    parts = root.split(".")
    if family in parts[:-1]:
        root = ".".join(parts[:max(i for i, part in enumerate(parts[:-1]) if part == family) + 1])
    package = importlib.import_module(root)
    names = [root]
    if hasattr(package, "__path__"):  # every module of the package, whether this process imported it or not
        names += [info.name for info in pkgutil.walk_packages(package.__path__, root + ".")]
    return [importlib.import_module(name) for name in sorted(names)]


def method_hash(benchmark: Any) -> str:
    """The hash of what a benchmark measures: asv's code of it, the helpers it reaches, the family's module.

    Hashed as asv hashes code for its token-stable fingerprint (comments and blank lines do not count).

    Args:
        benchmark: an asv_runner benchmark from asv's discovery.

    Returns:
        A SHA-256 hex digest.
    """
    starts = [benchmark.func, *benchmark._setups, benchmark._setup_cache]
    own_package = getattr(benchmark.func, "__func__", benchmark.func).__module__.partition(".")[0]
    parts = [benchmark.code]
    bound = getattr(benchmark.func, "__self__", None)  # asv binds a class's benchmark to an instance
    owner = None if bound is None else type(bound)
    for obj in reached(starts, (own_package, *FIGURE_PACKAGES), () if owner is None else (owner,)):
        parts.append(f"# {obj.__module__}.{obj.__qualname__}\n{inspect.getsource(obj)}")
    family = getattr(owner, "family", "")
    if family:
        for module in family_modules(family):
            parts.append(f"# {module.__name__}\n{inspect.getsource(module)}")
    return code_fingerprint("\n\n".join(parts))


def discovered(names: Iterable[str] | None = None, root: Path = BENCHMARKS) -> dict[str, Any]:
    """The suite's benchmarks as asv discovers them (asv_runner's discovery), by name; only ``names`` if given."""
    update_sys_path(str(root))
    wanted = None if names is None else set(names)
    return {b.name: b for b in disc_benchmarks(str(root)) if wanted is None or b.name in wanted}


@dataclass(frozen=True)
class Drift:
    """A pinned benchmark whose method hash is no longer the one recorded with its pin."""

    name: str
    recorded: str
    now: str
    unapplied: bool = False  # the pin's version is not the one asv reads from the benchmark

    def message(self) -> str:
        """What to do about it, naming the command."""
        if self.unapplied:
            return (f"{self.name}: pinned at version {self.recorded[:12]} but asv reads {self.now[:12]}: its class "
                    f"does not take its version from benchmarks/series.json (common.SERIES_VERSIONS)")
        return (f"{self.name}: its method changed since its version was pinned (method hash {self.recorded[:12]} "
                f"recorded, {self.now[:12]} now). Either give it a new version, so its series restarts: "
                f"`{COMMAND} restart {self.name} --commit FIRST_COMMIT --why WHY`; or show that what it measures "
                f"did not change (same figures before and after) and record the new hash: "
                f"`{COMMAND} record {self.name}`.")


def drifts(pins: dict[str, Pin], benchmarks: dict[str, Any]) -> list[Drift]:
    """The pinned benchmarks whose method hash drifted (a pin whose benchmark is gone drifts to "missing")."""
    found = []
    for name, pin in sorted(pins.items()):
        now = method_hash(benchmarks[name]) if name in benchmarks else "missing"
        if now != pin.method:
            found.append(Drift(name, pin.method, now))
        elif benchmarks[name].version != pin.version:
            found.append(Drift(name, pin.version, benchmarks[name].version, unapplied=True))
    return found


def main(argv: list[str] | None = None) -> int:
    """``scripts/series check|record|restart``: check the pins, record a method hash, or restart a series."""
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="action", required=True)
    check = sub.add_parser("check", help="fail (exit 1) with a message for each pinned benchmark whose method drifted")
    check.add_argument("--benchmarks", type=Path, default=BENCHMARKS, help="the suite's folder (with series.json)")
    record = sub.add_parser("record", help="the measurement did not change: record the method hash as it is now")
    record.add_argument("names", nargs="+")
    restart = sub.add_parser("restart", help="the method changed: a new version (the method hash), series restarts; "
                             "a benchmark not pinned yet is pinned")
    restart.add_argument("names", nargs="+")
    restart.add_argument("--commit", required=True, help="the first results commit measured with the new method")
    restart.add_argument("--why", required=True, help="what changed in the method")
    pin_parser = sub.add_parser("pin", help="pin the version asv reads now (no restart), with its method hash: "
                                "before a benchmark's code moves, so that the move cannot restart its series")
    pin_parser.add_argument("names", nargs="*",
                            help="benchmarks to pin (default: every benchmark not pinned yet)")
    args = parser.parse_args(argv)
    try:
        require_checkout(COMMAND)
    except NoCheckout as error:
        parser.exit(2, f"{COMMAND}: {error}\n")
    if args.action == "check":
        pins = load_pins(args.benchmarks / PINS_FILE.name)
        found = drifts(pins, discovered(pins, args.benchmarks))
        for drift in found:
            print(drift.message())
        print(f"{len(pins) - len(found)} of {len(pins)} pinned series hold their method")
        return 1 if found else 0
    pins = load_pins()
    unknown = [name for name in args.names if name not in pins]
    if unknown and args.action == "record":
        parser.exit(2, f"{COMMAND}: not a pinned benchmark: {', '.join(unknown)}; allowed: {', '.join(pins)}\n")
    benchmarks = discovered(args.names or None)
    names = args.names or [name for name in benchmarks if name not in pins]  # pin: every benchmark not pinned yet
    # restart also pins a benchmark that had asv's own version (a method changed in a helper asv never hashed).
    missing = [name for name in names if name not in benchmarks]
    if missing:
        parser.exit(2, f"{COMMAND}: not a benchmark of the suite: {', '.join(missing)}\n")
    for name in names:
        now = method_hash(benchmarks[name])
        pin = pins.get(name, Pin(version=benchmarks[name].version, method=""))
        if args.action == "record":
            pins[name] = dataclasses.replace(pin, method=now)
        elif args.action == "pin":
            pins[name] = dataclasses.replace(pin, version=benchmarks[name].version, method=now)
        else:
            restarted = (*pin.restarts, {"commit": args.commit, "previous": pin.version, "why": args.why})
            pins[name] = Pin(version=now, method=now, restarts=restarted)
        print(f"{name}: version {pins[name].version[:12]}, method {now[:12]}")
    save_pins(pins)
    if args.action == "restart":  # a new version: the committed suite description names the old one
        print("results/benchmarks.json now names the old versions: python -m pitfalls.suite_description --write")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Run tests in a shuffled order: collect the node ids, shuffle them with a printed seed, run them in that order.

    python tests/shuffled.py [--seed N] [--bucket module|global] [--parallel N] [pytest arguments: files, -m, -k ...]

Tests must not depend on their order (each builds its own sites and result files); this shows it without a
plugin, and the test command runs the suite this way. With ``--bucket module`` (the default, as in
pytest-random-order) the modules run in a shuffled order and each module's tests in a shuffled order among
themselves, so a module-scoped fixture (a built site, a merged history) is made once; ``--bucket global``
shuffles every test among all. The same seed gives the same order, so a failure can be replayed.

With ``--parallel N`` the tests are collected once, then run in two phases: the tests not marked ``serial`` across N
processes (pytest-xdist, one module per process at a time), then the ``serial`` ones (timing and memory figures read
against planted values) with the machine to themselves. In the parallel phase the modules of `LONGEST` are dealt
first (in a shuffled order among themselves, their tests shuffled as any module's), then the others: a long module
dealt last would leave the other processes idle for most of its length (the main job's scripts take about 2 minutes
of a 9-minute phase), so the longest go first, as a longest-first schedule does. xdist deals the modules in the
order given only with ``--no-loadscope-reorder``: by default it sorts them by their number of tests, which put the
container's few long tests minutes into the phase.

Each phase ends with its wall time and how many of the machine's cores were busy on average (from /proc/stat),
and the run with the slowest tests of both phases (``--slowest N``, default 10).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# The files the project's conftest writes: the tests marked serial (one collection), each test's seconds.
from conftest import DURATIONS_ENV, SERIAL_LIST_ENV

VERBOSITY = re.compile(r"-[qv]+|--quiet|--verbose")
NO_TESTS = 5  # pytest's exit status when nothing was collected
# The modules that take longest in the parallel phase, measured on the 2-core machine from a fresh clone and HOME
# (seconds of their tests in that phase, 2 processes): the main job's scripts (114), the asv suite (108), the rank
# groups (98), the image built and run (90, its Debian base made beside the set-up), scan-loader (66), the GPU
# run's checks at the rehearsal's sizes (60), the loader (56), the Slurm fleet (49), the installed wheel (39), the
# merged fleet of two real runs (36). Every other module takes at most 27 s, so none dealt last keeps a process busy
# long after the others are done.
LONGEST = ("tests/test_container.py", "tests/test_run_suite.py", "tests/test_parallel.py",
           "tests/test_gpu_run_checks.py", "tests/test_slurm_fleet.py", "tests/test_scan_loader.py",
           "tests/test_asv_suite.py", "tests/test_loader.py", "tests/test_merge.py", "tests/test_wheel.py")


def shuffle(nodes: list[str], seed: int, bucket: str, first: tuple[str, ...] = ()) -> list[str]:
    """The node ids in the seed's order: all at once (``global``), or module by module (``module``), the modules
    named in ``first`` ahead of the others."""
    rng = random.Random(seed)
    if bucket == "global":
        shuffled = list(nodes)
        rng.shuffle(shuffled)
        return shuffled
    modules: dict[str, list[str]] = {}
    for node in nodes:
        modules.setdefault(node.split("::", 1)[0], []).append(node)
    order = list(modules)
    rng.shuffle(order)
    order.sort(key=lambda module: module not in first)  # stable: the shuffled order within each group
    out: list[str] = []
    for module in order:
        tests = modules[module]
        rng.shuffle(tests)
        out += tests
    return out


def is_selection(arg: str) -> bool:
    """Whether a pytest argument names tests (a path, or a node id) rather than being an option or its value."""
    return not arg.startswith("-") and os.path.exists(arg.split("::", 1)[0])


def collect(pytest_args: list[str], env: dict[str, str] | None = None) -> tuple[int, list[str], str]:
    """(pytest's status, the node ids, its output) of a collection with these arguments (and ``env`` added)."""
    # One node id per line needs exactly one -q: the caller's verbosity goes to the run only.
    selecting = [arg for arg in pytest_args if not VERBOSITY.fullmatch(arg)]
    collected = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                                *selecting], capture_output=True, text=True, check=False,
                               env={**os.environ, **(env or {})})
    nodes = [line for line in collected.stdout.splitlines() if "::" in line and is_selection(line)]
    return collected.returncode, nodes, collected.stdout[-3000:] + collected.stderr[-3000:]


def cpu_seconds(stat: Path = Path("/proc/stat")) -> tuple[float, float] | None:
    """(busy, all) seconds of every core since boot, from the kernel's ``cpu`` line; None where there is none."""
    try:
        fields = [int(field) for field in stat.read_text().splitlines()[0].split()[1:]]
    except (OSError, IndexError, ValueError):
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle and iowait: a core waiting on a disk is free
    # guest and guest_nice (fields 8 and 9) are already counted in user and nice.
    total = sum(fields[:8])
    return (total - idle) / ticks, total / ticks


def cores_busy(before: tuple[float, float] | None, after: tuple[float, float] | None) -> str:
    """", X.X of N cores busy" between two `cpu_seconds` readings, or "" where either is missing."""
    if before is None or after is None or after[1] <= before[1]:
        return ""
    cores = os.cpu_count() or 1
    return f", {cores * (after[0] - before[0]) / (after[1] - before[1]):.1f} of {cores} cores busy"


def run_nodes(nodes: list[str], pytest_args: list[str], seed: int, bucket: str, extra: list[str], label: str,
              first: tuple[str, ...] = ()) -> int:
    """Shuffle ``nodes`` (the modules in ``first`` first) and run them in that order with the options of
    ``pytest_args`` and ``extra``; pytest's status (`NO_TESTS` when there is none to run)."""
    if not nodes:
        print(f"{label}no test selected", flush=True)
        return NO_TESTS
    print(f"{label}shuffled {len(nodes)} tests with --seed {seed} --bucket {bucket} "
          f"(replay: python tests/shuffled.py --seed {seed} --bucket {bucket} ...)", flush=True)
    # The node ids already carry the selection (files, -m, -k); pytest runs them in the order given, with the
    # other options (-x, --durations, ...).
    options = [arg for arg in pytest_args if not is_selection(arg)]
    began, cpu = time.monotonic(), cpu_seconds()
    status = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *options, *extra,
                             *shuffle(nodes, seed, bucket, first)], check=False).returncode
    # The phase's whole wall time, its interpreters' start and exit included, which pytest's own "in N s" is not:
    # the test command's budget is this.
    print(f"{label}ran in {time.monotonic() - began:.0f} s{cores_busy(cpu, cpu_seconds())}", flush=True)
    return status


def collected_or_status(status: int, nodes: list[str], output: str) -> int | None:
    """None when a collection found tests to run, else the status to end with (its output printed)."""
    if status == NO_TESTS or (status == 0 and not nodes):
        print("no test selected", flush=True)
        return NO_TESTS
    if status != 0:
        print(output, file=sys.stderr)
        return status
    return None


def run_shuffled(pytest_args: list[str], seed: int, bucket: str) -> int:
    """Collect with ``pytest_args``, shuffle, and run in that order in one process; pytest's status."""
    began = time.monotonic()
    status, nodes, output = collect(pytest_args)
    ended = collected_or_status(status, nodes, output)
    if ended is not None:
        return ended
    print(f"collected {len(nodes)} tests in {time.monotonic() - began:.0f} s", flush=True)
    return run_nodes(nodes, pytest_args, seed, bucket, [], "")


def run_phases(pytest_args: list[str], seed: int, bucket: str, processes: int) -> int:
    """Collect once, then run the tests not marked serial across ``processes`` processes and the serial ones alone;
    the worse of the two phases' statuses."""
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="pitfalls-collect-") as scratch:
        listing = Path(scratch) / "serial.json"
        status, nodes, output = collect(pytest_args, env={SERIAL_LIST_ENV: str(listing)})
        serial = set(json.loads(listing.read_text())) if listing.is_file() else set()
    ended = collected_or_status(status, nodes, output)
    if ended is not None:
        return ended
    phases = {"parallel": [node for node in nodes if node not in serial],
              "serial": [node for node in nodes if node in serial]}
    print(f"collected {len(nodes)} tests in {time.monotonic() - began:.0f} s: {len(phases['parallel'])} for the "
          f"parallel phase, {len(phases['serial'])} for the serial one", flush=True)
    # loadfile keeps a module's tests in one process, in the shuffled order, so a module-scoped fixture is made once;
    # xdist deals the modules in the order given (the longest first) only when told not to sort them.
    spread = ["-n", str(processes), "--dist", "loadfile", "--no-loadscope-reorder"]
    statuses = [run_nodes(phases["parallel"], [*pytest_args, "--phase", "parallel"], seed, bucket, spread,
                          "[parallel phase] ", LONGEST),
                run_nodes(phases["serial"], [*pytest_args, "--phase", "serial"], seed, bucket, [], "[serial phase] ")]
    ran = [status for status in statuses if status != NO_TESTS]
    return max(ran) if ran else NO_TESTS


def print_slowest(durations: Path, count: int = 10) -> None:
    """The ``count`` slowest tests of both phases (setup, call and teardown together), in wall and CPU seconds."""
    if not durations.is_file():
        return
    measured: dict[str, list[float]] = json.loads(durations.read_text())
    ranked = sorted(measured.items(), key=lambda item: -item[1][0])[:count]
    print(f"the {len(ranked)} slowest tests of both phases (wall s, CPU s of the test and the children it waited "
          f"for):", flush=True)
    for node, (wall, cpu) in ranked:
        print(f"  {wall:7.1f} {cpu:7.1f}  {node}", flush=True)
    walls, cpus = (sum(seconds[i] for seconds in measured.values()) for i in (0, 1))
    print(f"  {walls:7.1f} {cpus:7.1f}  all {len(measured)} tests", flush=True)


def main(argv: list[str] | None = None) -> int:
    """Collect, shuffle and run (in two phases with ``--parallel``); returns pytest's exit status."""
    parser = argparse.ArgumentParser(prog="tests/shuffled.py", description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=None, help="the shuffle's seed (default: a random one)")
    parser.add_argument("--bucket", choices=("module", "global"), default="module",
                        help="shuffle within and across modules (default), or every test among all")
    parser.add_argument("--parallel", type=int, default=1, metavar="N",
                        help="run the tests not marked serial across N processes (pytest-xdist, a module per "
                             "process), then the serial ones alone (default 1: all in one process)")
    parser.add_argument("--slowest", type=int, default=10, metavar="N",
                        help="how many of the slowest tests of both phases to print at the end (default 10)")
    args, pytest_args = parser.parse_known_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    with tempfile.TemporaryDirectory(prefix="pitfalls-durations-") as scratch:
        durations = Path(scratch) / "durations.json"
        os.environ[DURATIONS_ENV] = str(durations)
        if args.parallel <= 1:
            status = run_shuffled(pytest_args, seed, args.bucket)
        else:
            status = run_phases(pytest_args, seed, args.bucket, args.parallel)
        print_slowest(durations, args.slowest)
    return status

if __name__ == "__main__":
    sys.exit(main())

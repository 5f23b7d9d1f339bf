"""The mutation check: plant one fault per instrument in a copy of the package and show its tests fail on it.

Run by ``scripts/mutation-check`` (all mutations, or those named). Each mutation replaces one exact piece of
source (its first occurrence) in a throw-away copy of ``src/``, ``benchmarks/`` and ``tests/``, runs the tests
named with it against that copy, and passes only when they fail. A mutation whose text is no longer in the
source is an error, so the list follows the code. The checkout itself is never changed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutation:
    """One planted fault: where, what replaces what, and the tests that must catch it."""

    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]


MUTATIONS = (
    Mutation("hazard counter ignores boolean masks", "src/pitfalls/probes/syncs.py",
             'return f"{name} (bool mask)" if _has_mask_index(indices) else None', "return None",
             ("tests/test_probe_hazard_counts.py::test_loss_forward_hazards",)),
    Mutation("CUDA sync counter misses every sync", "src/pitfalls/probes/syncs.py",
             "            total += 1\n", "            total += 0\n",
             ("tests/test_probe_syncs.py::test_cuda_sync_count_counts_the_warnings_of_the_counted_calls_only",)),
    Mutation("speedup ratio inverted", "src/pitfalls/probes/timing.py",
             "ratio=statistics.median(b / c for b, c in pairs)", "ratio=statistics.median(c / b for b, c in pairs)",
             ("tests/test_probe_timing.py::test_interleaved_speedup_alternates_and_reports_exact_ratios",)),
    Mutation("NVML summary reports the max as the mean", "src/pitfalls/probes/nvml.py",
             "mean=statistics.fmean(values)", "mean=max(values)",
             ("tests/test_probe_nvml.py::test_normal_sampling_summarises_every_metric_in_its_unit",)),
    Mutation("graph breaks counted one too many", "src/pitfalls/probes/compiled.py",
             "graph_breaks=max(graphs - 1, 0)", "graph_breaks=graphs",
             ("tests/test_probe_compiled.py::test_nonzero_breaks_the_graph_once_with_dynamos_reason",)),
    Mutation("a dead worker is torch's RuntimeError, not WorkerDied", "src/pitfalls/families/loader/steps.py",
             "raise WorkerDied(f\"DataLoader worker", "raise RuntimeError(f\"DataLoader worker",
             ("tests/test_loader.py::test_a_worker_that_dies_is_a_clear_error_within_the_timeout_and_leaves_no_process",)),
    Mutation("loader memory skips the workers", "src/pitfalls/probes/group_memory.py",
             "procs = [root, *root.children(recursive=True)]", "procs = [root]",
             ("tests/test_loader.py::test_memory_held_grows_with_the_workers_and_pss_counts_shared_pages_once",)),
    Mutation("gpu_decode's stand-in passes the gate", "src/pitfalls/families/loader/equivalence.py",
             "    if stand_in and not failed:", "    stand_in = \"\"\n    if stand_in and not failed:",
             ("tests/test_loader.py::test_the_gate_passes_every_variant_and_names_what_it_could_not_run",)),
    Mutation("series guard ignores the helpers a benchmark reaches", "src/pitfalls/series_guard.py",
             "    for obj in reached(starts,", "    for obj in [] or reached((),",
             ("tests/test_series_guard.py::test_a_helper_changed_under_a_pin_fails_with_what_to_do",)),
)


def run(mutation: Mutation, timeout_s: float) -> tuple[bool, str]:
    """Plant ``mutation`` in a copy of the package and run its tests there.

    Returns:
        (caught: the tests failed, one line of what happened).
    """
    source = (ROOT / mutation.path).read_text()
    if mutation.old not in source:
        raise SystemExit(f"mutation {mutation.name!r}: its text is no longer in {mutation.path}; "
                         "update tests/mutations.py")
    with tempfile.TemporaryDirectory(prefix="pitfalls-mutation-") as tmp:
        copy = Path(tmp)
        for folder in ("src", "benchmarks", "tests"):
            shutil.copytree(ROOT / folder, copy / folder, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        for name in ("pyproject.toml", "asv.conf.json"):
            shutil.copy(ROOT / name, copy / name)
        (copy / mutation.path).write_text(source.replace(mutation.old, mutation.new, 1))  # the first occurrence
        # The copy's src comes first on the path, before the checkout's editable install.
        env = {**os.environ, "PYTHONPATH": str(copy / "src")}
        probe = subprocess.run([sys.executable, "-c", "import pitfalls; print(pitfalls.__file__)"], env=env,
                               capture_output=True, text=True, check=True, cwd=copy)
        if not Path(probe.stdout.strip()).is_relative_to(copy):
            raise SystemExit(f"the copy's package is not the one imported: {probe.stdout.strip()}")
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                               "-p", "no:randomly", *mutation.tests], env=env, cwd=copy, capture_output=True,
                              text=True, timeout=timeout_s)
        last = (done.stdout.strip().splitlines() or ["(no output)"])[-1]
        return done.returncode == 1, f"{last} ({time.monotonic() - started:.0f} s)"


def main(argv: list[str] | None = None) -> int:
    """Run the mutations (all, or those whose name contains one of ``names``); exit 1 if any was not caught."""
    parser = argparse.ArgumentParser(prog="scripts/mutation-check", description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="run only the mutations whose name contains one of these")
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds for each mutation's tests")
    args = parser.parse_args(argv)
    chosen = [m for m in MUTATIONS if not args.names or any(n in m.name for n in args.names)]
    if not chosen:
        parser.exit(2, f"{parser.prog}: no mutation matches {args.names}; allowed: "
                       f"{', '.join(repr(m.name) for m in MUTATIONS)}\n")
    if args.list:
        for m in chosen:
            print(f"{m.name}: {m.path}, caught by {', '.join(m.tests)}")
        return 0
    missed = []
    for mutation in chosen:
        caught, what = run(mutation, args.timeout)
        print(f"{'caught' if caught else 'MISSED'}: {mutation.name}: {what}", flush=True)
        if not caught:
            missed.append(mutation.name)
    print(f"{len(chosen) - len(missed)} of {len(chosen)} mutations caught" + (f"; missed: {missed}" if missed else ""))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())

"""The committed suite description, results/benchmarks.json, against what asv writes from this checkout.

``python -m pitfalls.suite_description`` exits 1 naming the benchmarks that differ; ``--write`` refreshes the
file as asv would write it (docs/testing.md, "The committed suite description").
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from asv import runner as asv_runner_script
from asv import util as asv_util

from pitfalls import processes
from pitfalls.asv_files import SUITE_API, read_json
from pitfalls.checkout import ROOT, NoCheckout, require_checkout

COMMITTED = ROOT / "results" / "benchmarks.json"
REFRESH = "python -m pitfalls.suite_description --write"
# What the main job leaves out of the suite's environment: plug-in families and another grid change the suite.
UNSET = ("PITFALLS_FAMILIES", "PITFALLS_GRID", "PITFALLS_ROUNDS")


def discovered(benchmarks: Path = ROOT / "benchmarks") -> dict[str, Any]:
    """The suite as asv discovers it (asv's own ``benchmark.py discover``, as ``asv run`` calls it), by name."""
    env = {k: v for k, v in os.environ.items() if k not in UNSET}
    with tempfile.TemporaryDirectory(prefix="pitfalls-discover-") as tmp:
        out = Path(tmp) / "result.json"
        command = [sys.executable, asv_runner_script.BENCHMARK_RUN_SCRIPT, "discover", str(benchmarks), str(out)]
        done = processes.run(command, timeout_s=600, cwd=tmp, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise subprocess.CalledProcessError(done.returncode, command, done.stdout, done.stderr)
        listed = json.loads(out.read_text())
    return {benchmark["name"]: benchmark for benchmark in listed}


def differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """One line per benchmark that is missing, new, or described otherwise (naming the fields that differ)."""
    lines = [f"{name}: not in the suite any more" for name in sorted(set(old) - set(new))]
    lines += [f"{name}: not in the committed description" for name in sorted(set(new) - set(old))]
    for name in sorted(set(old) & set(new)):
        fields = sorted(k for k in set(old[name]) | set(new[name]) if old[name].get(k) != new[name].get(k))
        if fields:
            lines.append(f"{name}: {', '.join(fields)} differ")
    return lines


def main(argv: list[str] | None = None) -> int:
    """Check (exit 1 on a difference) or ``--write`` the committed suite description."""
    parser = argparse.ArgumentParser(prog="python -m pitfalls.suite_description",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="refresh results/benchmarks.json from the checkout")
    args = parser.parse_args(argv)
    try:
        require_checkout("python -m pitfalls.suite_description")
    except NoCheckout as error:
        parser.exit(2, f"{parser.prog}: {error}\n")
    new = discovered()
    if args.write:
        asv_util.write_json(str(COMMITTED), new, SUITE_API)
        print(f"wrote {COMMITTED.relative_to(ROOT)}: {len(new)} benchmarks")
        return 0
    lines = differences(read_json(COMMITTED, SUITE_API), new)
    for line in lines:
        print(line)
    if lines:
        print(f"results/benchmarks.json does not describe this checkout's suite; refresh it: {REFRESH}")
        return 1
    print(f"results/benchmarks.json describes this checkout's suite ({len(new)} benchmarks)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

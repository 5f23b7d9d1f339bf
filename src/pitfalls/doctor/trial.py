"""One trial of `pitfalls doctor --try`, in a fresh process: the script run with a DataLoader setting applied from
outside, its steps timed as the doctor times them, stopped after its timed steps.

``python -m pitfalls.doctor.trial SPEC OUT`` reads the trial (`Trial`, as JSON) and writes what it measured to OUT
as JSON: the timed steps' median and mean milliseconds, the share of them spent waiting in ``next()``, the loader's
workers, the first batches' digests, how the run ended and, when the script failed, its last line. The script's own
output goes to stderr.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pitfalls.doctor.options import DoctorOptions
from pitfalls.doctor.run import run_doctor
from pitfalls.doctor.settings import applied

__all__ = ["Trial", "main", "run_trial"]


@dataclass(frozen=True)
class Trial:
    """What one trial runs: the script with its arguments, the DataLoader arguments to override (empty: the
    script's own), and the doctor's warm-up and timed steps, batches digested and budget (as `DoctorOptions`)."""

    script: str
    args: tuple[str, ...]
    setting: dict[str, Any] = field(default_factory=dict)
    warmup: int = 3
    steps: int = 10
    digests: int = 4
    budget_s: float = 300.0


def run_trial(trial: Trial) -> dict[str, Any]:
    """Run one trial in this process; returns what it measured (see the module's docstring)."""
    options = DoctorOptions(warmup=trial.warmup, steps=trial.steps, budget_s=trial.budget_s, trial=True,
                            digests=trial.digests)
    with applied(trial.setting):
        report = run_doctor(trial.script, trial.args, options, quiet_stdout=True)
    loader = report.loader
    return {
        "measured": report.steps.measured,
        "median_ms": report.step_ms[0] if report.step_ms else None,
        "mean_ms": report.step_ms[2] if report.step_ms else None,
        "wait_share": loader.wait_share if loader is not None else None,
        "workers": loader.workers if loader is not None else None,
        "digests": list(report.digests), "ended": report.ended,
        "failure": report.failure.last_line if report.failure is not None else None,
    }


def main(argv: Sequence[str]) -> int:
    """``python -m pitfalls.doctor.trial SPEC OUT``; returns 0 once OUT is written."""
    spec, out = argv
    raw = json.loads(spec)
    trial = Trial(**{**raw, "args": tuple(raw["args"])})
    Path(out).write_text(json.dumps({"trial": asdict(trial), **run_trial(trial)}), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

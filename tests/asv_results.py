"""Build small asv results folders with asv's own results API, as inputs for the merge and gate tests."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

from asv import util
from asv.results import Results
from asv.runner import BenchmarkResult

FACTS = {"arch": "x86_64", "cpu": "Test CPU", "num_cpu": "2", "os": "Linux test", "ram": "1000"}


def benchmark(name: str, params: list[list[str]], version: str = "v1", unit: str = "unit") -> dict[str, Any]:
    """A benchmarks.json entry as asv writes it."""
    kind = "time" if ".time_" in name else "track"
    return {"name": name, "version": version, "params": params, "param_names": [f"p{i}" for i in range(len(params))],
            "type": kind, "unit": "seconds" if kind == "time" else unit}


def write_suite(folder: Path, benchmarks: list[dict[str, Any]]) -> None:
    util.write_json(str(folder / "benchmarks.json"), {b["name"]: b for b in benchmarks}, api_version=2)


def write_machine(folder: Path, machine: str, facts: dict[str, str] | None = None) -> None:
    util.write_json(str(folder / machine / "machine.json"), {**(facts or FACTS), "machine": machine}, api_version=1)


def results(machine: str, commit: str, env_name: str = "installed-py3.11-torch2.13.0",
            facts: dict[str, str] | None = None) -> Results:
    """An empty asv Results for one machine, commit and environment."""
    params = {**(facts or FACTS), "machine": machine, "python": "3.11", "torch": "2.13.0"}
    return Results(params, {"torch": "2.13.0"}, commit, 1_700_000_000_000, "3.11", env_name, {})


def add(res: Results, bench: dict[str, Any], values: list[float | None], *, samples: list[list[float]] | None = None,
        minute: int = 0) -> None:
    """Record ``values`` (one per parameter combination) for ``bench``; times carry samples and a number."""
    started = datetime.datetime(2026, 1, 1, 12, minute, tzinfo=datetime.timezone.utc)
    numbers = [1 if samples else None for _ in values]
    outcome = BenchmarkResult(result=values, samples=samples or [None] * len(values), number=numbers, errcode=0,
                              stderr="", profile=None)
    res.add_result(bench, outcome, started_at=started, record_samples=bool(samples))

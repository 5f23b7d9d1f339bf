"""The results index: which committed file was made by which run, on which machine, and what it holds, read from
the files themselves and ``results/EDITS.md``.
"""

from __future__ import annotations

import datetime as dt
import math
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pitfalls import asv_files
from pitfalls.markdown import code, link, table

__all__ = ["results_lines"]

# How asv's environment names say which command made a file.
_MADE_BY = {
    "installed": "`scripts/run-suite` (the main job, the checkout's venv)",
    "virtualenv": "`scripts/run-history` (asv's virtualenv of that torch)",
    "existing": "asv's `existing` environment",
}


def _date(ms: float) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).strftime("%Y-%m-%d")


def _span(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s" if minutes else f"{rest} s"


def _cases(values: Any) -> Iterator[str]:
    """'measured', 'n/a' (asv's NaN: skipped with a reason) or 'failed' (asv's null) for each case of a result."""
    for value in values if isinstance(values, list) else [values]:
        if value is None:
            yield "failed"
        elif isinstance(value, float) and math.isnan(value):
            yield "n/a"
        else:
            yield "measured"


def _file_facts(path: Path) -> dict[str, Any]:
    result = asv_files.load(path)
    names = result.get_all_result_keys()
    starts = {name: at for name in names if (at := result.started_at.get(name)) is not None}
    ends = [at + 1000 * took for name, at in starts.items() if (took := result.duration.get(name)) is not None]
    counted = Counter(state for name in names for state in _cases(result._results.get(name)))
    return {"commit": result.commit_hash, "env": result.env_name, "date": result.date,
            "torch": result.params.get("torch", "not recorded"), "python": result.params.get("python", "?"),
            "benchmarks": len(names), "cases": counted, "first": min(starts.values(), default=None),
            "span": (max(ends) - min(starts.values())) / 1000 if starts and ends else None}


def _edited(results: Path) -> set[str]:
    edits = results / "EDITS.md"
    if not edits.is_file():
        return set()
    return {line.split("|")[1].strip().strip("`") for line in edits.read_text(encoding="utf-8").splitlines()
            if line.startswith("| `")}


def _machine_line(machine: Path) -> str:
    facts = asv_files.read_json(machine / asv_files.MACHINE, asv_files.MACHINE_API)
    ram = f"{int(facts['ram']) / 2**30:.1f} GiB RAM" if str(facts.get("ram", "")).isdigit() else None
    said = [facts.get("cpu"), f"{facts['num_cpu']} CPUs" if facts.get("num_cpu") else None, ram,
            *(facts.get(k) for k in ("gpu", "gpu_driver", "cuda", "image", "arch", "os"))]
    return f"**{code(machine.name)}**: " + ", ".join(str(s) for s in said if s) + "."


def results_lines(root: Path, page: Path) -> list[str]:
    """Per machine under ``results/``: its facts, then one line per results file, oldest commit first.

    Args:
        root: the repository's root.
        page: the page the lines go to (for its links), from the root.
    """
    results = root / "results"
    edited = _edited(results)
    lines: list[str] = []
    for machine in (results / name for name in asv_files.machines(results)):
        files = [(results / f, _file_facts(results / f)) for f in asv_files.result_files(results, machine.name)]
        files.sort(key=lambda item: (item[1]["date"], item[1]["env"]))
        body = []
        for path, facts in files:
            name = path.relative_to(results).as_posix()
            cases = facts["cases"]
            body.append((
                link(code(facts["commit"][:8]), path.relative_to(root), page), _date(facts["date"]),
                f"{code(facts['env'])}: Python {facts['python']}, torch {facts['torch']}",
                _MADE_BY.get(facts["env"].split("-", 1)[0], "unknown"),
                _date(facts["first"]) if facts["first"] is not None else "-",
                facts["benchmarks"],
                f"{cases['measured']} / {cases['n/a']} / {cases['failed']}",
                _span(facts["span"]) if facts["span"] is not None else "-",
                link("relabelled", Path("results/EDITS.md"), page) if name in edited else "-"))
        lines += [_machine_line(machine), "",
                  *table(("commit", "commit date", "environment", "made by", "measured", "benchmarks",
                          "cases measured / n/a / failed", "first start to last end", "edited"), body), ""]
    return lines[:-1]

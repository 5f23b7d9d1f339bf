"""The results index: which committed file was made by which run, on which machine, and what it holds.

Everything here is read from the files themselves: asv's ``machine.json`` and results files under ``results/``
(commit, environment, when each benchmark started and how long it ran, which cases were measured), the list of
edits in ``results/EDITS.md``. The GPU runs under ``proof/`` have their own index (`pitfalls.docs.proof_index`).
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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
    data = json.loads(path.read_text(encoding="utf-8"))
    columns = data["result_columns"]
    at, took, value = columns.index("started_at"), columns.index("duration"), columns.index("result")
    runs = [entry for entry in data["results"].values() if len(entry) > max(at, took)]
    starts = [entry[at] for entry in runs if entry[at] is not None]
    ends = [entry[at] + 1000 * entry[took] for entry in runs if entry[at] is not None and entry[took] is not None]
    counted = Counter(state for entry in data["results"].values() for state in _cases(entry[value]))
    return {"commit": data["commit_hash"], "env": data["env_name"], "date": data["date"],
            "torch": data["params"].get("torch", "not recorded"), "python": data["params"].get("python", "?"),
            "benchmarks": len(data["results"]), "cases": counted, "first": min(starts, default=None),
            "span": (max(ends) - min(starts)) / 1000 if starts and ends else None}


def _edited(results: Path) -> set[str]:
    edits = results / "EDITS.md"
    if not edits.is_file():
        return set()
    return {line.split("|")[1].strip().strip("`") for line in edits.read_text(encoding="utf-8").splitlines()
            if line.startswith("| `")}


def _machine_line(machine: Path) -> str:
    facts = json.loads((machine / "machine.json").read_text(encoding="utf-8"))
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
    for machine in sorted(p for p in results.iterdir() if (p / "machine.json").is_file()):
        files = [(p, _file_facts(p)) for p in machine.glob("*.json") if p.name != "machine.json"]
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

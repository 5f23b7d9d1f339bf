"""The budgeted GPU run rehearsed on this machine, as a lent GPU machine would run it: the same command with
``--device cpu --budget 30``, its archive merged into a results folder that ``pitfalls report`` reads.

It is not timed: it checks from the run's own plan and ledger that no piece started when its cost exceeded the time
left, and that every piece is accounted for (done, over budget with its reason, or failed with its log)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pitfalls.gpu_run.pieces import PIECES
from pitfalls.gpu_run.plan import DONE, MARGIN_S, OVER_BUDGET

ROOT = Path(__file__).resolve().parents[1]
# The loss slice's cheap pieces and two headlines fit, its step and speedup slices do not: both kinds of entry, pieces
# of two groups, in half a minute (by the costs recorded for cpu).
BUDGET = 30

# Its asv slices time cases: the machine to itself, as the main job has it. It runs again in the CUDA-build leg.
pytestmark = [pytest.mark.serial, pytest.mark.cuda_build]


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("rehearsal")
    out, archive = base / "run", base / "gpu-run.tar.gz"
    done = subprocess.run(["bash", "scripts/gpu-run", str(out), "--budget", str(BUDGET), "--device", "cpu",
                           "--archive", str(archive)], cwd=ROOT, capture_output=True, text=True, timeout=BUDGET * 4)
    return {"base": base, "out": out, "archive": archive, "done": done,
            "ledger": json.loads((out / "run.json").read_text()), "plan": json.loads((out / "plan.json").read_text())}


def test_no_piece_started_when_its_cost_exceeded_the_time_left(rehearsal: dict[str, Any]) -> None:
    done, ledger, plan = rehearsal["done"], rehearsal["ledger"], rehearsal["plan"]
    assert done.returncode == 0, done.stderr[-3000:]
    entries = ledger["pieces"]
    assert [e["name"] for e in entries] == [p["name"] for p in plan["pieces"]] == [p.name for p in PIECES]
    for entry in entries:
        if entry["started"]:
            assert entry["cost_s"] <= entry["left_s"], entry
        elif entry["status"] == OVER_BUDGET:
            assert entry["cost_s"] > entry["left_s"], entry
            assert entry["reason"].startswith("over budget: needs about"), entry
    started = [e for e in entries if e["started"]]
    assert started and all(e["status"] == DONE for e in started)
    assert any(e["status"] == OVER_BUDGET for e in entries), f"{BUDGET} s cannot hold every piece: none was left out"
    # The whole run ends within the budget, its margin and the last piece's stop.
    assert ledger["seconds"] <= BUDGET + MARGIN_S + 30
    # The costs planned are the committed ones for this kind, not guesses.
    assert all(p["from"] == "recorded on cpu" for p in plan["pieces"])
    summary = done.stderr[done.stderr.index("gpu-run: summary"):]
    assert "done:" in summary and "over budget:" in summary


def test_its_archive_merges_into_a_results_folder_that_the_report_reads(rehearsal: dict[str, Any]) -> None:
    base = rehearsal["base"]
    readme = base / "README.md"
    shutil.copy(ROOT / "README.md", readme)
    costs = base / "costs.json"
    shutil.copy(ROOT / "proof" / "costs.json", costs)
    merged = subprocess.run([sys.executable, "-m", "pitfalls.gpu_run", "merge", str(rehearsal["archive"]),
                             "--results", str(base / "results"), "--proof", str(base / "proof"), "--costs",
                             str(costs), "--readme", str(readme), "--no-publish"],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert merged.returncode == 0, merged.stderr[-3000:]
    machine = rehearsal["ledger"]["machine"]
    files = [p for p in (base / "results" / machine).glob("*.json") if p.name != "machine.json"]
    assert len(files) == 1
    kept = list((base / "proof").glob(f"{machine}-*/report.md"))
    assert len(kept) == 1 and "# Budgeted GPU run" in kept[0].read_text()
    done_names = [e["name"] for e in rehearsal["ledger"]["pieces"] if e["status"] == DONE]
    recorded = json.loads(costs.read_text())["kinds"]["cpu"]
    assert set(done_names) <= set(recorded)
    report = subprocess.run([sys.executable, "-m", "pitfalls.cli", "report", "--results", str(base / "results"),
                             "--out", str(base / "report")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stderr[-3000:]
    text = (base / "report" / "README.md").read_text()
    assert f"## Machine `{machine}`" in text and "bench_loss" in text or "loss" in text
    # The first slice of the plan is the loss family's: its figures reached the report's folder.
    results = json.loads(files[0].read_text())["results"]
    assert any(name.startswith("bench_loss.") for name in results)

"""The budgeted GPU run rehearsed on this machine, as a lent GPU machine would run it: the same command with
``--device cpu --budget 30``, its archive merged into a results folder that ``pitfalls report`` reads; and the
pieces whose rows the docs' tables read, merged into a clone of the checkout whose generated pages then show them.

It is not timed: it checks from the run's own plan and ledger that no piece started when its cost exceeded the time
left, and that every piece is accounted for (done, over budget with its reason, or failed with its log)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sandbox import make_sandbox

from pitfalls.calibration.run import all_checks
from pitfalls.gpu_run.pieces import PIECES
from pitfalls.gpu_run.plan import DONE, MARGIN_S, OVER_BUDGET
from pitfalls.known.table import CUDA
from pitfalls.markdown import table
from pitfalls.proofs import CALIBRATION, CORPUS, read_proof, read_proofs

ROOT = Path(__file__).resolve().parents[1]
# The loss slice's cheap pieces and two headlines fit, its step and speedup slices do not: both kinds of entry, pieces
# of two groups, in half a minute (by the costs recorded for cpu).
BUDGET = 30

# Its asv slices time cases and its pieces are stopped at the budget: the machine to itself, as the main job has it.
# It rehearses the run of a GPU machine, whose torch is the CUDA build: where the test command's CUDA-build leg
# follows, it runs there alone (left_to_the_leg); else in the run that collects it.
pytestmark = [pytest.mark.serial, pytest.mark.cuda_build, pytest.mark.left_to_the_leg]


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


def _gpu_run(*args: str, cwd: Path = ROOT, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "scripts/gpu-run", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHON": sys.executable})


def _merge(archive: Path, repo: Path, *more: str) -> subprocess.CompletedProcess[str]:
    """``scripts/gpu-run merge`` into the folders of ``repo`` (its defaults are this checkout's)."""
    return _gpu_run("merge", str(archive), "--results", str(repo / "results"), "--proof", str(repo / "proof"),
                    "--costs", str(repo / "proof" / "costs.json"), "--readme", str(repo / "README.md"), "--no-publish",
                    *more)


def test_its_archive_merges_into_a_results_folder_that_the_report_reads(rehearsal: dict[str, Any]) -> None:
    base = rehearsal["base"]
    readme = base / "README.md"
    shutil.copy(ROOT / "README.md", readme)
    costs = base / "proof" / "costs.json"
    costs.parent.mkdir()
    shutil.copy(ROOT / "proof" / "costs.json", costs)
    merged = _merge(rehearsal["archive"], base)
    assert merged.returncode == 0, merged.stderr[-3000:]
    assert f"claims table regenerated in {readme}" in merged.stdout
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


def _column(page: str, marker: str, header: str) -> dict[str, str]:
    """A generated table's column by its header: first cell of each row -> that column's cell."""
    lines = page[page.index(marker):].splitlines()[1:]
    body = lines[:next(i for i, line in enumerate(lines) if not line.startswith("|"))]
    rows = [re.split(r"(?<!\\)\|", line.strip())[1:-1] for line in body]
    names = [cell.strip() for cell in rows[0]]
    assert header in names, f"no column {header!r} in {names}"
    return {row[0].strip(): row[names.index(header)].strip() for row in rows[2:]}


def _cell(value: Any) -> str:
    """A value as the docs' table builder writes it in a cell."""
    return table(("x",), ((value,),))[-1][2:-2]


def test_a_merged_runs_corpus_and_calibration_rows_reach_the_docs_tables(tmp_path: Path) -> None:
    # Two cheap pieces alone (the budgeted rehearsal above may leave them out): what the docs' tables read.
    out, archive = tmp_path / "run", tmp_path / "gpu-run.tar.gz"
    ran = _gpu_run(str(out), "--budget", "120", "--device", "cpu", "--only", f"{CORPUS},{CALIBRATION}", "--archive",
                   str(archive))
    assert ran.returncode == 0, ran.stderr[-3000:]
    run = read_proof(out)
    corpus, calibration = run.corpus_syncs(), run.calibration_rows()
    assert corpus and set(calibration) == {c.name for c in all_checks() if c.device == CUDA}
    repo = make_sandbox(tmp_path / "repo")
    before = {r.name for r in read_proofs(repo / "proof")}
    merged = _merge(archive, repo)
    assert merged.returncode == 0, merged.stderr[-3000:]
    [kept] = {r.name for r in read_proofs(repo / "proof")} - before
    written = subprocess.run([sys.executable, "-m", "pitfalls.docs", "--write"], cwd=repo, capture_output=True,
                             text=True, timeout=300)
    assert written.returncode == 0, written.stdout[-2000:] + written.stderr[-2000:]
    # The corpus table: the run's real CUDA syncs of each construct (on a CPU, why there are none) in its column.
    scan = (repo / "docs" / "scan.md").read_text()
    column = _column(scan, "<!-- generated by python -m pitfalls.docs: corpus -->",
                     f"real CUDA syncs, `proof/{kept}`")
    assert sorted(column.values()) == sorted(_cell(value) for value in corpus.values())
    # The calibration table: each CUDA check's row as the run read it.
    methodology = (repo / "docs" / "methodology.md").read_text()
    column = _column(methodology, "<!-- generated by python -m pitfalls.docs: calibration -->", f"`proof/{kept}`")
    assert all(row["error"] is None for row in calibration.values())  # no CUDA device: each row says why
    assert {check: column[check] for check in calibration} == {
        check: _cell(f"{row['verdict']}: {row['reason']}".rstrip(": ")) for check, row in calibration.items()}
    assert all(cell == "-" for check, cell in column.items() if check not in calibration)

"""The one reader of proof/: the committed one-call proof's folders and a budgeted run's folder read the same way."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from pitfalls.proofs import CALIBRATION, CORPUS, read_proof, read_proofs

ROOT = Path(__file__).resolve().parents[1]
PROOF = ROOT / "proof"


def test_the_committed_one_call_proof_reads_as_the_pieces_that_took_its_checks_over() -> None:
    runs = {run.name: run for run in read_proofs(PROOF)}
    corpus = runs["h200-2026-12-04/gate-corpus"]
    figures = json.loads((PROOF / "h200-2026-12-04" / "gate-corpus" / "figures.json").read_text())
    assert corpus.measured() == [CORPUS, "proof gate"]
    assert corpus.rows(CORPUS) == figures["corpus"]["rows"] and corpus.rows("proof gate") == figures["gate"]
    assert corpus.corpus_syncs() == {row["construct"]: row["cuda_syncs"] for row in figures["corpus"]["rows"]}
    assert corpus.environment()["gpus"][0]["name"] == "NVIDIA H200" and corpus.machine is None
    # A check that was not selected, or that the run stopped in, has no rows.
    assert corpus.rows("proof nvml") == [] and runs["h200-2026-12-04/syncs-nvml-timing"].rows("parallel memory") == []
    calibrated = runs["h200-2026-12-04"]
    rows = json.loads((PROOF / "h200-2026-12-04" / "calibrate-cuda.json").read_text())
    assert calibrated.calibration_rows() == {row["check"]: row for row in rows}
    assert calibrated.facts == {} and calibrated.environment() == {}


def test_a_budgeted_runs_folder_gives_its_pieces_ledger_calibration_rows_and_environment(tmp_path: Path) -> None:
    hardware = {"cpu_model": "x", "cpu_usable": 2, "gpus": [{"name": "G"}], "driver": "d", "cuda": "c", "torch": "t"}
    row = {"check": "cuda: one .item() is one sync", "unit": "syncs", "planted": 1, "measured": 1.0, "error": 0.0,
           "tolerance": 0.0, "verdict": "pass", "reason": ""}
    corpus = {"rows": [{"construct": "item", "cuda_syncs": 1.0}], "agreement": {}}
    figures = {"device": "cuda", "machine": "gpu-g", "date": "2026-12-06", "commit": "abc", "python": "3.12",
               "hardware": hardware, "seconds": 9.0, "pieces": [{"name": CORPUS, "status": "done"}],
               CORPUS: corpus, CALIBRATION: [row], "headline loss": {"skipped": "over budget"}}
    folder = tmp_path / "proof" / "gpu-g-2026-12-06"
    folder.mkdir(parents=True)
    (folder / "figures.json").write_text(json.dumps(figures))
    (folder / "run.json").write_text(json.dumps({"pieces": figures["pieces"]}))
    shutil.copytree(PROOF / "h200-2026-12-04", tmp_path / "proof" / "h200-2026-12-04")
    runs = {run.name: run for run in read_proofs(tmp_path / "proof")}
    run = runs["gpu-g-2026-12-06"]
    assert run.machine == "gpu-g" and run.facts["date"] == "2026-12-06"
    assert run.measured() == [CORPUS, CALIBRATION] and run.ledger == ({"name": CORPUS, "status": "done"},)
    assert run.corpus_syncs() == {"item": 1.0} and run.calibration_rows() == {row["check"]: row}
    assert run.environment() == {**hardware, "cpu_count": 2, "commit": "abc", "python": "3.12"}
    # The same folder read where the run wrote it, before any merge; with the run's environment, that is read.
    assert read_proof(folder).outcomes == run.outcomes
    environment = {"torch": "t", "cudnn": 91900, "container_image": "img", "commit": "abc"}
    (folder / "figures.json").write_text(json.dumps({**figures, "environment": environment}))
    assert read_proof(folder).environment() == environment and read_proof(folder).outcomes == run.outcomes
    assert "h200-2026-12-04/gate-corpus" in runs and read_proofs(tmp_path / "missing") == []

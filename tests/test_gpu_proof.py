"""scripts/gpu-proof: its dry run on the CPU writes the whole report, with reasons where a GPU is needed."""

from __future__ import annotations

import json

import pytest

from pitfalls import gpu_proof
from pitfalls.calibration.table import CUDA
from pitfalls.devices import cuda_available
from pitfalls.family import Comparison
from pitfalls.probes import HazardCounts, Unavailable
from pitfalls.registry import all_families


@pytest.mark.slow
def test_dry_run_writes_every_section_with_real_hazards_and_reasons(tmp_path, capsys, monkeypatch):
    # The calibration section through a few of its rows (tests/test_calibrate.py runs them all): two minutes less.
    from pitfalls.calibration import run as calibration_run

    every = calibration_run.all_checks()
    few = [c for c in every if c.device == CUDA or c.name.startswith(("sync hazards", "time: busy-wait 5 ms"))]
    monkeypatch.setattr(calibration_run, "all_checks", lambda *a, **kw: tuple(few))
    assert gpu_proof.main([str(tmp_path), "--device", "cpu", "--no-asv"]) == 0
    figures = json.loads((tmp_path / "figures.json").read_text())
    report = (tmp_path / "report.md").read_text()
    assert report.strip() in capsys.readouterr().out
    rows = {(r["family"], r["variant"]): r for r in figures["syncs"]}
    assert set(rows) == {(e.name, v) for e in all_families().values() if "hazards" in e.figures for v in e.cases}
    # The counts pitfalls check shows, per call at the smoke size.
    assert rows[("loss", "naive")]["sync_hazards"] == 5
    assert rows[("loss", "ignore_index")]["sync_hazards"] == 0
    assert rows[("sampler", "nonzero")]["sync_hazards"] == 2
    assert rows[("sampler", "static")]["sync_hazards"] == 0
    assert rows[("loss", "floor")]["sync_hazards"] == 0 and rows[("sampler", "floor")]["sync_hazards"] == 0
    if not cuda_available():
        assert all(r["cuda_syncs"].startswith("unavailable: no CUDA device") for r in rows.values())
        assert all(r["count_for_count"] == "n/a" for r in rows.values())
    naive = rows[("loss", "naive")]
    assert naive["expected_syncs"] == 5 and sum(naive["by_op"].values()) == 5
    gate = {(r["family"], r["variant"]): r for r in figures["gate"]}
    assert set(gate) == {(e.name, v) for e in all_families().values() for v in e.variants}
    # No row passes unless its own code path ran.
    assert all(r["ran"] == "its own" for r in gate.values() if r["matches_naive"] == "yes")
    if not cuda_available():
        assert gate[("loader", "gpu_decode")]["matches_naive"] == "n/a"
        assert gate[("loader", "gpu_decode")]["detail"].startswith("not run here: OpenCV decoded its JPEG bytes")
    speedups = {(r["family"], r["variant"]): r for r in figures["speedups"]}
    assert set(speedups) == {(e.name, v) for e in all_families().values() for v in e.cases[1:]}
    # A variant that needs what this machine lacks has its reason (loader's gpu_decode: CUDA and torchvision;
    # parallel's data_parallel: 2 GPUs).
    skipped = {key for key, row in speedups.items() if "skipped" in row}
    assert all(speedups[key]["skipped"] for key in skipped)
    assert {variant for _, variant in skipped} <= {"gpu_decode", "host_decode", "data_parallel",
                                                    "data_parallel_loss_inside"}
    for key, row in speedups.items():
        # Medians of interleaved rounds: every figure is a measured time, none a placeholder.
        assert key in skipped or (row["speedup"] > 0 and row["naive_ms"] > 0 and row["variant_ms"] > 0)
    nvml = {(r["family"], r["variant"]) for r in figures["nvml"]}
    assert nvml == {(e.name, v) for e in all_families().values() if "nvml" in e.figures for v in e.cases}
    for section in ("Real CUDA syncs", "The scan corpus", "Every variant against naive", "NVML while",
                    "CUDA-event time", "Speedup over naive", "asv quick grid", "Calibration: known answers"):
        assert section in report
    calibration = {r["check"]: r["verdict"] for r in figures["calibration"]}
    assert set(calibration) == {c.name for c in few}
    assert calibration["sync hazards: 3 planted .item()"] == "pass"
    if not cuda_available():
        assert calibration["cuda: one .item() is one sync"] == "not run"


@pytest.mark.skipif(cuda_available(), reason="checks the refusal where there is no CUDA device")
def test_refuses_to_prove_gpu_claims_without_a_gpu(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        gpu_proof.main([str(tmp_path)])
    assert exit_.value.code == 2
    assert "no CUDA device here" in capsys.readouterr().err
    assert not (tmp_path / "report.md").exists()


@pytest.mark.slow
def test_the_asv_part_records_full_machine_facts_under_the_installed_environment(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))  # a fresh machine: no ~/.asv-machine.json
    monkeypatch.delenv("PITFALLS_MACHINE", raising=False)
    name = gpu_proof.machine_name("cpu")
    assert name.startswith("cpu-") and name.endswith("cpu")
    outcome = gpu_proof.asv_quick_grid("cpu", tmp_path / "out", name)
    assert outcome["exit_code"] == 0, (tmp_path / "out" / "asv-run.log").read_text()[-3000:]
    folder = tmp_path / "out" / "results" / name
    facts = json.loads((folder / "machine.json").read_text())
    assert all(facts[key] for key in ("arch", "cpu", "num_cpu", "os", "ram"))
    [result] = [p for p in folder.glob("*.json") if p.name != "machine.json"]
    params = json.loads(result.read_text())["params"]
    assert "-installed-py" in result.name and params["python"].count(".") == 1 and params["torch"]
    assert {key: params[key] for key in facts if key != "version"} == {k: v for k, v in facts.items() if k != "version"}


def test_real_syncs_must_equal_the_hazards_count_for_count(monkeypatch):
    hazards = HazardCounts(counts=(("item", 1), ("nonzero", 2)))
    assert gpu_proof.syncs_agree(hazards, 3.0) == "yes"
    # Zero against non-zero was the old bar: 1 sync for 3 hazards now disagrees.
    assert gpu_proof.syncs_agree(hazards, 1.0) == "NO"
    assert gpu_proof.syncs_agree(HazardCounts(), 0.0) == "yes"
    assert gpu_proof.syncs_agree(hazards, Unavailable("no CUDA device")) == "n/a"
    # A known difference per op is stated in SYNCS_PER_HAZARD, and only that op counts differently.
    monkeypatch.setitem(gpu_proof.SYNCS_PER_HAZARD, "nonzero", 2)
    assert gpu_proof.expected_syncs(hazards) == 5
    assert gpu_proof.syncs_agree(hazards, 5.0) == "yes"


def test_the_gate_section_never_passes_a_stand_in(monkeypatch):
    rows = [Comparison("f", "own", "cuda", True, 0.0),
            Comparison("f", "bad", "cuda", False, 1.0, "differs"),
            Comparison.not_run("f", "decoded", "cuda", "stand-in ran: no decoder", stand_in="opencv_decoder")]
    monkeypatch.setattr(gpu_proof, "check_all", lambda devices: rows)
    got = {r["variant"]: r for r in gpu_proof.gate("cuda", gpu_proof.DRY_RUN_SIZES)}
    assert (got["own"]["matches_naive"], got["own"]["ran"]) == ("yes", "its own")
    assert (got["bad"]["matches_naive"], got["bad"]["detail"]) == ("NO", "differs")
    assert got["decoded"] == {"family": "f", "variant": "decoded", "matches_naive": "n/a", "max_abs_diff": None,
                              "ran": "stand-in: opencv_decoder", "detail": "not run here: stand-in ran: no decoder"}

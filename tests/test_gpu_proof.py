"""scripts/gpu-proof: its dry run on the CPU writes the whole report, with reasons where a GPU is needed."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pitfalls import gpu_proof
from pitfalls.devices import cuda_available
from pitfalls.family import Comparison
from pitfalls.known.table import CUDA
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
    assert rows[("loss", "naive")]["sync_hazards"] == 6
    assert rows[("loss", "ignore_index")]["sync_hazards"] == 0
    assert rows[("sampler", "nonzero")]["sync_hazards"] == 2
    assert rows[("sampler", "static")]["sync_hazards"] == 0
    assert rows[("loss", "floor")]["sync_hazards"] == 0 and rows[("sampler", "floor")]["sync_hazards"] == 0
    if not cuda_available():
        assert all(r["cuda_syncs"].startswith("unavailable: no CUDA device") for r in rows.values())
        assert all(r["count_for_count"] == "n/a" for r in rows.values())
    naive = rows[("loss", "naive")]
    assert naive["expected_syncs"] == 6 and sum(naive["by_op"].values()) == 6
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


def _planted_sections(seen_on_disk: dict[str, Any], out) -> tuple[gpu_proof.Section, ...]:
    """Three planted checks: one measures, one raises, one reads what the run had written when it started."""

    def measures(device, sizes):
        return [{"planted": 7, "device": device}]

    def raises(device, sizes):
        raise RuntimeError("planted: CUDA error: an illegal memory access was encountered")

    def reads_the_report(device, sizes):
        seen_on_disk.update(json.loads((out / "figures.json").read_text()))
        return [{"planted": 9}]

    return (gpu_proof.Section("first", "First", "", measures), gpu_proof.Section("second", "Second", "", raises),
            gpu_proof.Section("third", "Third", "", reads_the_report))


def test_a_check_that_raises_is_reported_with_its_traceback_and_the_next_checks_run(tmp_path, monkeypatch, capsys):
    seen: dict[str, Any] = {}
    monkeypatch.setattr(gpu_proof, "SECTIONS", _planted_sections(seen, tmp_path))
    assert gpu_proof.main([str(tmp_path), "--device", "cpu", "--no-asv"]) == 1
    figures = json.loads((tmp_path / "figures.json").read_text())
    assert figures["first"] == [{"planted": 7, "device": "cpu"}] and figures["third"] == [{"planted": 9}]
    assert figures["second"]["error"] == "RuntimeError: planted: CUDA error: an illegal memory access was encountered"
    assert "in raises" in figures["second"]["traceback"]
    assert gpu_proof.failed_checks(figures) == ["second"]
    report = (tmp_path / "report.md").read_text()
    assert "Checks that raised (each one's traceback is in its section): second." in report
    second = report.split("## Second")[1].split("## Third")[0]
    assert "**failed**: `RuntimeError: planted" in second and "Traceback (most recent call last)" in second
    assert "| 9 |" in report.split("## Third")[1]
    assert "planted: CUDA error" in capsys.readouterr().err
    # Written around each check: while the third one ran, the first two were on disk, the third marked unfinished.
    assert seen["first"] == figures["first"] and seen["second"]["error"] == figures["second"]["error"]
    assert seen["third"] == gpu_proof.UNFINISHED and seen["asv"] == gpu_proof.NOT_REACHED and "seconds" not in seen


def test_a_report_of_a_run_stopped_part_way_marks_what_it_did_not_reach(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_proof, "SECTIONS", _planted_sections({}, tmp_path))
    report = gpu_proof.render_report({"device": "cuda", "environment": {}, "first": [{"planted": 7}],
                                      "second": gpu_proof.UNFINISHED})
    assert "Wall time (still running, or stopped) s." in report
    assert "## Second\n\nskipped: started, not finished: the run stopped (or hung) in this check" in report
    assert report.count("skipped: not reached: the run stopped before this check") == 2  # third, asv
    assert "| 7 |" in report and "Checks that raised" not in report


def test_a_check_stopped_or_failing_part_way_keeps_the_rows_it_had_finished(tmp_path, monkeypatch):
    seen: list[dict[str, Any]] = []

    def two_rows_then_stuck(device, sizes):
        rows = gpu_proof.section_rows()
        rows.append({"case": "a", "speedup": 240.0})
        seen.append(json.loads((tmp_path / "figures.json").read_text())["slow"])  # what a time limit would leave
        rows.append({"case": "b", "speedup": 3.0})
        raise RuntimeError("planted: out of memory in case c")

    monkeypatch.setattr(gpu_proof, "SECTIONS", (gpu_proof.Section("slow", "Slow", "", two_rows_then_stuck),))
    assert gpu_proof.main([str(tmp_path), "--device", "cpu", "--no-asv"]) == 1
    assert seen == [{**gpu_proof.UNFINISHED, gpu_proof.ROWS_DONE: [{"case": "a", "speedup": 240.0}]}]
    stopped = gpu_proof.render_report({"device": "cuda", "environment": {}, "slow": seen[0]})
    assert "| a | 240.0 |" in stopped
    assert "skipped: started, not finished: the run stopped (or hung) in this check (after the 1 rows above)" in stopped
    figures = json.loads((tmp_path / "figures.json").read_text())
    assert figures["slow"][gpu_proof.ROWS_DONE] == [{"case": "a", "speedup": 240.0}, {"case": "b", "speedup": 3.0}]
    assert gpu_proof.failed_checks(figures) == ["slow"]
    report = (tmp_path / "report.md").read_text().split("## Slow")[1]
    assert report.index("| b | 3.0 |") < report.index("**failed**: `RuntimeError: planted: out of memory in case c`")
    # Outside a proof run the list is a plain one.
    assert type(gpu_proof.section_rows()) is list


def test_only_runs_the_named_checks_and_refuses_an_unknown_one_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gpu_proof, "SECTIONS", _planted_sections({}, tmp_path))
    assert gpu_proof.main([str(tmp_path), "--device", "cpu", "--only", "first"]) == 0
    figures = json.loads((tmp_path / "figures.json").read_text())
    assert figures["first"] == [{"planted": 7, "device": "cpu"}]
    assert figures["second"] == figures["third"] == figures["asv"] == {"skipped": "not selected (--only first)"}
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        gpu_proof.main([str(tmp_path / "again"), "--device", "cpu", "--only", "first,sycns"])
    assert exit_.value.code == 2
    [error] = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert error == "gpu-proof: error: --only: no such check 'sycns' (choose from first, second, third, asv)"
    assert not (tmp_path / "again").exists()


def test_every_check_of_a_proof_run_has_a_section_of_its_own():
    # The real table: each key is unique, so `--only` and figures.json name one check each.
    keys = gpu_proof.check_names()
    assert len(set(keys)) == len(keys) == len(gpu_proof.SECTIONS) + 1
    assert {"syncs", "gate", "calibration", "parallel memory", "asv"} <= set(keys)


def test_event_time_of_no_device_work_is_a_reason_not_a_division_by_zero(monkeypatch):
    from pitfalls.probes.timing import CudaEventTiming

    monkeypatch.setattr(gpu_proof, "cuda_event_time", lambda *a, **kw: CudaEventTiming(median_ms=0.0, times_ms=(0.0,)))
    rows = [r for r in gpu_proof.event_against_host_time("cpu", gpu_proof.DRY_RUN_SIZES) if "host_ms" in r]
    assert rows and all(r["host_over_events"] == "unavailable: the events timed no device work" for r in rows)
    assert all(r["cuda_event_ms"] == 0.0 and r["host_ms"] > 0 for r in rows)

"""The GPU proof's checks as pieces of the budgeted run: at the rehearsal's sizes on the CPU they measure real
hazards and give reasons where a GPU is needed; a piece keeps its finished rows when it raises or is stopped, and
its report says what happened to it."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from pitfalls.calibration.run import all_checks
from pitfalls.devices import cuda_available
from pitfalls.family import Comparison
from pitfalls.gpu_run import checks, report, syncs
from pitfalls.gpu_run.outcome import ROWS_DONE, UNFINISHED, attempt, is_failure, piece_rows, section_text
from pitfalls.gpu_run.plan import DONE, FAILED, NOT_SELECTED, Entry, Piece
from pitfalls.gpu_run.sizes import ON_GPU, REHEARSAL
from pitfalls.known.table import CUDA
from pitfalls.probes import HazardCounts, Unavailable
from pitfalls.registry import all_families, family

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_at_the_rehearsals_sizes_the_checks_measure_real_hazards_and_give_reasons_for_the_gpu() -> None:
    rows = {(r["family"], r["variant"]): r for r in syncs.syncs_against_hazards("cpu", REHEARSAL)}
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
    gate = {(r["family"], r["variant"]): r for r in checks.gate("cpu", REHEARSAL)}
    assert set(gate) == {(e.name, v) for e in all_families().values() for v in e.variants}
    # No row passes unless its own code path ran.
    assert all(r["ran"] == "its own" for r in gate.values() if r["matches_naive"] == "yes")
    if not cuda_available():
        assert gate[("loader", "gpu_decode")]["matches_naive"] == "n/a"
        assert gate[("loader", "gpu_decode")]["detail"].startswith("not run here: OpenCV decoded its JPEG bytes")
    nvml = {(r["family"], r["variant"]) for r in checks.nvml_while_looping("cpu", REHEARSAL)}
    assert nvml == {(e.name, v) for e in all_families().values() if "nvml" in e.figures for v in e.cases}
    calibration = {r["check"]: r["verdict"] for r in checks.calibration_cuda_rows("cpu", REHEARSAL)}
    # Every CUDA row of the table, the doctor's rules on a device among them, and no CPU row.
    assert set(calibration) == {c.name for c in all_checks() if c.device == CUDA}
    assert "cuda: one .item() is one sync" in calibration
    if not cuda_available():
        assert set(calibration.values()) == {"not run"}


@pytest.mark.slow
def test_speedups_run_every_variant_and_floor_at_each_of_the_families_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    # Two families stand for all: the loop over sizes and variants is the same for each.
    chosen = {name: entry for name, entry in all_families().items() if name in ("loss", "sampler")}
    monkeypatch.setattr(checks, "all_families", lambda: chosen)
    found = checks.speedups("cpu", REHEARSAL)
    expected = {(name, variant, json.dumps(size, sort_keys=True)) for name in chosen
                for size in REHEARSAL.of(name) for variant in family(name).cases[1:]}
    assert {(r["family"], r["variant"], json.dumps(r["sizes"], sort_keys=True)) for r in found} == expected
    # Medians of interleaved rounds: every figure is a measured time, none a placeholder.
    assert all(r["speedup"] > 0 and r["naive_ms"] > 0 and r["variant_ms"] > 0 for r in found)


def test_on_a_gpu_the_sizes_are_the_families_article_sizes_and_the_rehearsals_have_every_form() -> None:
    for name, entry in all_families().items():
        assert ON_GPU.of(name) == tuple(dict(s) for s in (entry.article_sizes or (entry.smoke,)))
    assert ON_GPU.of("loss") == ({"batch": 256, "image_size": 256},)
    # The sampler's rehearsal has both of the article's forms, so that every headline of it has rows.
    assert {size.get("batch", 1) for size in REHEARSAL.of("sampler")} == {1, 32}
    assert {size.get("batch", 1) for size in ON_GPU.of("sampler")} == {1, 32}


def test_real_syncs_must_equal_the_hazards_count_for_count(monkeypatch: pytest.MonkeyPatch) -> None:
    hazards = HazardCounts(counts=(("item", 1), ("nonzero", 2)))
    assert syncs.syncs_agree(hazards, 3.0) == "yes"
    # Zero against non-zero was the old bar: 1 sync for 3 hazards now disagrees.
    assert syncs.syncs_agree(hazards, 1.0) == "NO"
    assert syncs.syncs_agree(HazardCounts(), 0.0) == "yes"
    assert syncs.syncs_agree(hazards, Unavailable("no CUDA device")) == "n/a"
    # A known difference per op is stated in SYNCS_PER_HAZARD, and only that op counts differently.
    monkeypatch.setitem(syncs.SYNCS_PER_HAZARD, "nonzero", 2)
    assert syncs.expected_syncs(hazards) == 5
    assert syncs.syncs_agree(hazards, 5.0) == "yes"


def test_the_gate_never_passes_a_stand_in(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [Comparison("f", "own", "cuda", True, 0.0),
            Comparison("f", "bad", "cuda", False, 1.0, "differs"),
            Comparison.not_run("f", "decoded", "cuda", "stand-in ran: no decoder", stand_in="opencv_decoder")]
    monkeypatch.setattr(checks, "check_all", lambda devices: rows)
    got = {r["variant"]: r for r in checks.gate("cuda", REHEARSAL)}
    assert (got["own"]["matches_naive"], got["own"]["ran"]) == ("yes", "its own")
    assert (got["bad"]["matches_naive"], got["bad"]["detail"]) == ("NO", "differs")
    assert got["decoded"] == {"family": "f", "variant": "decoded", "matches_naive": "n/a", "max_abs_diff": None,
                              "ran": "stand-in: opencv_decoder", "detail": "not run here: stand-in ran: no decoder"}


def test_event_time_of_no_device_work_is_a_reason_not_a_division_by_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    from pitfalls.probes.timing import CudaEventTiming

    monkeypatch.setattr(checks, "cuda_event_time", lambda *a, **kw: CudaEventTiming(median_ms=0.0, times_ms=(0.0,)))
    rows = [r for r in checks.event_against_host_time("cpu", REHEARSAL) if "host_ms" in r]
    assert rows and all(r["host_over_events"] == "unavailable: the events timed no device work" for r in rows)
    assert all(r["cuda_event_ms"] == 0.0 and r["host_ms"] > 0 for r in rows)


def test_a_piece_keeps_the_rows_it_finished_when_it_raises_and_its_report_shows_them_above_the_traceback(
        capsys: pytest.CaptureFixture[str]) -> None:
    written: list[dict[str, Any]] = []

    def two_rows_then_out_of_memory() -> list[dict[str, Any]]:
        rows = piece_rows()
        rows.append({"case": "a", "speedup": 240.0})
        rows.append({"case": "b", "speedup": 3.0})
        raise RuntimeError("planted: CUDA error: out of memory in case c")

    figures: dict[str, Any] = {}
    attempt(figures, "slow", two_rows_then_out_of_memory, lambda saved: written.append(json.loads(json.dumps(saved))))
    # Saved when it started, after each row (what a stop by the budget would leave), and when it ended.
    first, both = [{"case": "a", "speedup": 240.0}], [{"case": "a", "speedup": 240.0}, {"case": "b", "speedup": 3.0}]
    assert [w["slow"] for w in written[:3]] == [UNFINISHED, {**UNFINISHED, ROWS_DONE: first},
                                                {**UNFINISHED, ROWS_DONE: both}]
    outcome = figures["slow"]
    assert is_failure(outcome) and outcome["error"] == "RuntimeError: planted: CUDA error: out of memory in case c"
    assert "in two_rows_then_out_of_memory" in outcome["traceback"] and written[-1]["slow"] == outcome
    text = section_text(outcome)
    assert text.index("| b | 3.0 |") < text.index("**failed**: `RuntimeError: planted: CUDA error: out of memory")
    assert "Traceback (most recent call last)" in text
    assert "planted: CUDA error" in capsys.readouterr().err
    stopped = section_text(written[1]["slow"])
    assert "| a | 240.0 |" in stopped
    assert "skipped: started, not finished: the run stopped (or hung) in this check (after the 1 rows above)" in stopped
    # Outside a piece the list is a plain one.
    assert type(piece_rows()) is list


def test_the_report_of_a_run_stopped_part_way_marks_what_it_did_not_reach(tmp_path: Path) -> None:
    pieces = (Piece("first", 1, "measures", {"cpu": 1}), Piece("second", 2, "raises", {"cpu": 1}),
              Piece("third", 3, "not reached", {"cpu": 1}), Piece("fourth", 4, "not chosen", {"cpu": 1}))
    (tmp_path / "pieces").mkdir()
    (tmp_path / "pieces" / "first.json").write_text(json.dumps({"name": "first", "outcome": [{"planted": 7}]}))
    (tmp_path / "pieces" / "second.json").write_text(json.dumps({"name": "second", "outcome": {
        "error": "RuntimeError: planted", "traceback": "Traceback (most recent call last):\nRuntimeError: planted"}}))
    entries = [Entry("first", 1, DONE, 1, "guess", 60, 1.0, 0), Entry("second", 2, FAILED, 1, "guess", 59, 1.0, 1,
                                                                      "exit 1"),
               Entry("fourth", 4, NOT_SELECTED, 1, "guess", 58)]
    data = report.figures(pieces, entries, tmp_path, {"device": "cpu", "machine": "m"}, None)
    assert data["first"] == [{"planted": 7}] and is_failure(data["second"])
    assert data["third"] == report.PENDING and data["fourth"] == {"skipped": NOT_SELECTED}
    text = report.render(data, entries, pieces)
    assert "wall time (still running, or stopped)" in text and "| 7 |" in text
    assert "**failed**: `RuntimeError: planted`" in text.split("## second")[1].split("## third")[0]
    assert "skipped: not reached: the run stopped before this piece" in text.split("## third")[1]


@pytest.mark.slow
def test_an_asv_slice_records_full_machine_facts_under_the_installed_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pitfalls.gpu_run.slices import AsvSlice, run_slice
    from pitfalls.runner.machine import hardware, machine_name

    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))  # a fresh machine: no ~/.asv-machine.json
    facts = hardware(sys.executable, "cpu")
    name = machine_name(facts)
    assert name.startswith("cpu-") and name.endswith("cpu")
    out = tmp_path / "out"
    out.mkdir()
    outcome = run_slice(AsvSlice("bench_sampler", "SyncHazards", mode_axis=False), out, "cpu", name, facts, ROOT)
    assert outcome["exit_code"] == 0, (out / outcome["log"]).read_text()[-3000:]
    folder = out / "results" / name
    recorded = json.loads((folder / "machine.json").read_text())
    assert all(recorded[key] for key in ("arch", "cpu", "num_cpu", "os", "ram"))
    [result] = [p for p in folder.glob("*.json") if p.name != "machine.json"]
    assert outcome["merged"] and all((out / "results" / merged).is_file() for merged in outcome["merged"])
    params = json.loads(result.read_text())["params"]
    assert "-installed-py" in result.name and params["python"].count(".") == 1 and params["torch"]
    assert {key: params[key] for key in recorded if key != "version"} == {k: v for k, v in recorded.items()
                                                                        if k != "version"}
    # Its stage was the slice's own: nothing of it is left in the run's folder.
    assert not list(out.glob(".slice-*"))


@pytest.mark.parametrize(("name", "column"), [("proof syncs", "count_for_count"), ("proof gate", "matches_naive")])
def test_a_row_that_says_no_fails_its_piece_and_one_that_agrees_does_not(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, column: str) -> None:
    from pitfalls.gpu_run import pieces

    (tmp_path / pieces.FACTS).write_text(json.dumps({"device": "cpu", "machine": "m", "hardware": {},
                                                     "root": str(ROOT)}))
    piece = Piece(name, 4, "planted", {"cpu": 1})
    verdicts = {"agree": ["yes", "n/a"], "disagree": ["yes", "NO"]}
    for planted, expected in (("agree", 0), ("disagree", 1)):
        rows = [{"variant": str(i), column: said} for i, said in enumerate(verdicts[planted])]
        monkeypatch.setitem(pieces.CATALOGUE, name, (piece, lambda ctx, rows=rows: rows))
        assert pieces.run_piece(name, tmp_path) == expected, planted
        assert pieces.outcome_of(tmp_path, name) == rows

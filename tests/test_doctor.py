"""`pitfalls doctor` on the planted training script: every planted answer read back, from one shared run."""

from __future__ import annotations

import contextlib
import json

import pytest
from rich.console import Console

from pitfalls import cli
from pitfalls.doctor import DoctorOptions, DoctorReport, checks, planted, run_doctor
from pitfalls.doctor.render import render
from pitfalls.gpu_run.doctor import gpu_check

# The loader's wait is read against its planted sleeps: with the machine to itself.
pytestmark = pytest.mark.serial

SCRIPT = str(planted.TRAIN)


def _run() -> DoctorReport:
    return checks.run_planted()


@pytest.fixture(scope="module")
def report() -> DoctorReport:
    return _run()


def at(report: DoctorReport, kind: str, text: str) -> list:
    return list(report.finding_at(kind, SCRIPT, checks.planted_line(text)))


def test_it_stops_the_endless_loop_after_warm_up_timed_scanned_and_memory_steps(report):
    steps = report.steps
    counts = (steps.warmup, steps.measured, steps.memory, steps.before_scan, steps.scanned, steps.gpu, steps.total)
    assert counts == (3, 10, 5, 1, 5, 0, 24)
    assert steps.counted_by == "optimizer"
    assert report.ended == "stopped: its 24 steps are done" and report.failure is None


def test_each_planted_sync_is_named_at_its_line_with_its_count_per_step(report):
    for line in (checks.ITEM, checks.NONZERO, checks.HELPER, checks.TOLIST, checks.OPTIMIZER):
        assert checks.syncs_at(report, line) == line.per_step, line
    (item,) = at(report, "sync", checks.ITEM.text)
    (nonzero,) = at(report, "sync", checks.NONZERO.text)
    assert (item.title, nonzero.title) == (".item()", "aten.nonzero")
    assert item.call_sites == () and item.cost == "cost not measurable on a CPU" and item.ms_per_step is None
    syncs = {(f.line, f.per_step) for f in report.findings if f.kind == "sync"}
    assert len(syncs) == 4  # the planted ones, nothing else: AdamW's host-side step counts are no sync


def test_the_helper_names_the_steps_line_that_calls_it(report):
    (helper,) = at(report, "sync", checks.HELPER.text)
    assert helper.call_sites == ((SCRIPT, checks.planted_line(checks.HELPER.caller)),)


def test_the_loader_ranks_first_and_waits_its_planted_sleeps_within_ten_percent():
    report = _run()
    first = report.findings[0]
    assert (first.kind, first.rank, first.line) == ("loader", 1, checks.planted_line("for x, y in loader:"))
    wanted = planted.BATCH * planted.ITEM_MS
    measured = report.loader.ms_per_step
    if abs(measured - wanted) > 0.10 * wanted:  # a shared machine can disturb one run: measured once more
        measured = _run().loader.ms_per_step
    assert abs(measured - wanted) <= 0.10 * wanted, measured
    assert report.loader.verdict == "loader-bound" and report.loader.workers == 0
    assert first.share_of_step == pytest.approx(report.loader.wait_share)  # the loader family's wait share


def test_one_graph_break_with_its_reason_and_a_recompile(report):
    (graph_break,) = report.compile.graph_breaks
    assert graph_break.line == checks.planted_line("    torch._dynamo.graph_break()")
    assert "torch._dynamo.graph_break()" in graph_break.reason
    assert {r.function for r in report.compile.recompiles} == {"scale"}
    assert all("size mismatch" in r.reason for r in report.compile.recompiles)
    assert report.compile.compile_s is not None and report.compile.compile_s > 0
    (finding,) = [f for f in report.findings if f.kind == "compile"]
    assert finding.ms_per_step is None and finding.per_step is None and finding.fix


def test_findings_with_a_measured_cost_rank_before_the_rest(report):
    ranks = [f.rank for f in report.findings]
    assert ranks == list(range(1, len(ranks) + 1))
    measured = [f.ms_per_step is not None for f in report.findings]
    assert measured == sorted(measured, reverse=True)
    unmeasured = [f.per_step if f.per_step is not None else -1 for f in report.findings if f.ms_per_step is None]
    assert unmeasured == sorted(unmeasured, reverse=True)
    assert report.explained is not None and 0 < report.explained <= 1.5


def test_json_and_text_reports(report, capsys):
    data = report.as_json()
    assert set(data["steps"]) >= {"warmup", "measured", "scanned"}
    assert set(data["step_ms"]) == {"median", "p90", "mean"}
    assert set(data["findings"][0]) >= {"rank", "kind", "title", "path", "line", "per_step", "call_sites",
                                        "ms_per_step", "share_of_step", "fix"}
    assert set(data["loader"]) >= {"wait_share", "ms_per_step", "verdict", "batch_bytes"}
    assert set(data["compile"]) >= {"graph_breaks", "recompiles", "compile_s"}
    assert data["memory"]["source"] == "process group" and data["memory"]["peak_bytes"] > 0
    assert data["real_syncs"] == "not measured: no GPU"
    json.dumps(data)
    console = Console(record=True, width=200)
    render(report, console)
    text = console.export_text()
    assert "counted by the first optimizer's steps" in text and "<- train.py:" in text
    assert "not measured: real syncs by line (CUDA's sync debug mode): no GPU" in text


def test_without_the_first_steps_provenance_adamw_would_read_false_syncs(monkeypatch):
    # The first step runs under keep_provenance, where AdamW makes its host-side step counts: without that
    # record, the counter takes them for device tensors and their .item() for syncs, one per parameter tensor.
    from pitfalls.doctor import phases

    monkeypatch.setattr(phases, "keep_provenance", lambda _provenance: contextlib.nullcontext())
    options = DoctorOptions(warmup=1, steps=1, scanned=1)
    args = [*checks.planted_args()[:4], "--item-ms", "0"]
    report = run_doctor(planted.TRAIN, args, options)
    assert checks.syncs_at(report, checks.OPTIMIZER) == 4  # AdamW over 2 weights and 2 biases


def test_gpu_check_runs_on_the_cpu_and_says_what_it_could_not_measure(tmp_path):
    found = gpu_check(tmp_path, "cpu")
    rows = {row["planted"]: row for row in found["rows"]}
    assert rows["helper"]["hazards_per_step"] == 1.0 and rows["tolist"]["hazards_per_step"] == 0.2
    assert rows["optimizer step"]["hazards_per_step"] == 0
    assert all(row["real_syncs_per_step"] == "not measured: no GPU" for row in rows.values())
    assert found["agreement"] == found["bandwidth_gb_s"] == "not measured: no GPU"
    assert json.loads((tmp_path / "doctor.json").read_text())["steps"]["total"] == 24
    assert "findings, the costliest first" in (tmp_path / "doctor.txt").read_text()


def test_the_calibration_rows_are_the_tables_and_publish_nothing():
    # That each row reads its planted answer is tests/test_calibrate.py's (every CPU row of `pitfalls calibrate`
    # passes, in one run of the whole table, none measured twice).
    from pitfalls.calibration.run import all_checks

    rows = checks.doctor_checks()
    assert rows and not any(row.published for row in rows)
    assert {row.name for row in rows} <= {row.name for row in all_checks()}


def test_the_command_prints_the_report_and_exits_0(capsys):
    args = checks.planted_args()[:4] + ["--item-ms", "0"]
    code = cli.main(["doctor", "--warmup", "2", "--steps", "1", "--scanned", "5", "--json", SCRIPT, "--", *args])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert data["steps"]["total"] == 14 and data["argv"] == args

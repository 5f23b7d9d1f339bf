"""`pitfalls report`'s calibration table, read from asv result files planted here (not the committed ones)."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

from asv.results import Results
from asv_results import FACTS, add, benchmark, write_machine, write_suite

from pitfalls.calibration.published import CHECK_PARAM, ERROR_METHOD
from pitfalls.calibration.run import all_checks
from pitfalls.report import read_results, summary_markdown
from pitfalls.report.calibration_errors import FAIL, NA, PASS, calibration_table
from pitfalls.report.calibration_table import suite_checks

PITFALLS = Path(sys.executable).with_name("pitfalls")
ERROR = f"bench_calibration.Error.{ERROR_METHOD}"
ERROR_PERCENT = f"bench_calibration.ErrorInPercent.{ERROR_METHOD}"
# One published error per check: within tolerance, over it, exact, skipped (NaN), failed (None), and a check
# this version does not have.
PLANTED = {
    "time: busy-wait 5 ms": 0.02,  # tolerance 15 %
    "speedup: 2T against T": 0.30,  # tolerance 10 %
    "sync hazards: 3 planted .item()": 0.0,  # exact
    "cuda: one .item() is one sync": math.nan,  # skipped: no CUDA device on that machine
    "peak memory: 64 MiB in one call": None,  # the check raised
    "old: a check since removed": 0.01,
}
OTHER = benchmark("bench_loss.Step.track_made_up_figure", [["'naive'"]], unit="x")


def error_benchmark(name: str, checks: list[str], unit: str) -> dict:
    bench = benchmark(name, [[repr(c) for c in checks]], unit=unit)
    bench["param_names"] = [CHECK_PARAM]
    return bench


def plant(folder: Path, machine: str, commit: str, date_ms: int, errors: dict[str, float | None],
          percent: dict[str, float | None] | None = None) -> None:
    """Write one asv results file of ``machine`` at ``commit``: the calibration errors and one other figure."""
    relative = error_benchmark(ERROR, list(errors), "relative")
    suite = [relative, OTHER]
    res = Results({**FACTS, "machine": machine, "python": "3.11", "torch": "2.13.0"}, {"torch": "2.13.0"}, commit,
                  date_ms, "3.11", "installed-py3.11-torch2.13.0", {})
    add(res, relative, list(errors.values()))
    if percent is not None:
        absolute = error_benchmark(ERROR_PERCENT, list(percent), "%")
        suite.append(absolute)
        add(res, absolute, list(percent.values()))
    add(res, OTHER, [1.5])
    write_suite(folder, suite)
    write_machine(folder, machine)
    res.save(str(folder))


def table_rows(markdown: str) -> dict[str, dict[str, str]]:
    """The calibration section's table: check -> {column heading: cell}."""
    section = markdown.split("## Calibration", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("| ")]
    header = [c.strip() for c in lines[0].strip("|").split(" | ")]
    rows = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        rows[cells[0]] = dict(zip(header, cells, strict=True))
    return rows


def test_each_check_is_judged_with_its_tolerance_a_column_per_machine(tmp_path):
    plant(tmp_path, "box", "a" * 40, 1_700_000_000_000, PLANTED)
    plant(tmp_path, "gpu-box", "b" * 40, 1_700_000_100_000, {"cuda: one .item() is one sync": 0.0},
          percent={"cuda: NVML busy half the time": 9.0})
    markdown = summary_markdown(read_results(tmp_path))
    rows = table_rows(markdown)

    assert [rows["time: busy-wait 5 ms"][k] for k in ("tolerance", "`box`", "`gpu-box`")] == ["15 %", "2.0 % pass",
                                                                                              "-"]
    assert rows["speedup: 2T against T"]["`box`"] == "30.0 % fail"
    assert [rows["sync hazards: 3 planted .item()"][k] for k in ("tolerance", "`box`")] == ["exact", "0.0 % pass"]
    # Skipped on the CPU machine (no CUDA device there), measured on the GPU one.
    assert [rows["cuda: one .item() is one sync"][k] for k in ("`box`", "`gpu-box`")] == ["n/a: no CUDA device",
                                                                                          "0.0 % pass"]
    assert rows["cuda: NVML busy half the time"]["`gpu-box`"] == "9 points pass"
    assert rows["peak memory: 64 MiB in one call"]["`box`"].startswith("n/a: failed")
    gone = rows["old: a check since removed"]
    assert gone["`box`"].startswith("n/a: no such check") and gone["tolerance"].startswith("unknown")
    # A check of this version that no result holds is listed with no figure, not left out and not passed.
    assert rows["compile: 2 planted graph breaks"]["`box`"] == "-"
    assert set(rows) == {c.name for c in suite_checks()} | {"old: a check since removed"}
    assert "commits `aaaaaaaa`" in markdown and "commits `bbbbbbbb`" in markdown
    # Measured: 5 ms, 2T (fail), hazards, the removed check's n/a aside; the GPU machine's two.
    assert "In the asv results, 4 of 5 measured checks within tolerance; 3 n/a." in markdown


def test_the_table_is_built_from_the_newest_figure_of_each_machine(tmp_path):
    plant(tmp_path, "box", "a" * 40, 1_700_000_000_000, {"speedup: 2T against T": 0.30})
    loaded = read_results(tmp_path)
    older = calibration_table(loaded.rows, all_checks())
    plant(tmp_path, "box", "c" * 40, 1_700_000_500_000, {"speedup: 2T against T": 0.04})
    newer = calibration_table(read_results(tmp_path).rows, all_checks())
    by_check = {line.check: line for line in older}, {line.check: line for line in newer}
    assert by_check[0]["speedup: 2T against T"].verdict == FAIL
    assert by_check[1]["speedup: 2T against T"].verdict == PASS
    assert by_check[1]["speedup: 2T against T"].commit == "c" * 40
    assert by_check[1]["time: busy-wait 5 ms"].verdict == NA


def test_an_error_whose_unit_changed_since_is_not_judged(tmp_path):
    plant(tmp_path, "box", "a" * 40, 1_700_000_000_000, {"time: busy-wait 5 ms": 0.02},
          percent={"time: busy-wait 50 ms": 3.0})
    lines = {line.check: line for line in calibration_table(read_results(tmp_path).rows, all_checks())}
    assert lines["time: busy-wait 50 ms"].verdict == NA
    assert "measured in '%'" in lines["time: busy-wait 50 ms"].reason


def test_results_without_calibration_figures_say_so_and_keep_the_uncalibrated_list(tmp_path):
    res = Results({**FACTS, "machine": "box", "python": "3.11", "torch": "2.13.0"}, {"torch": "2.13.0"}, "d" * 40,
                  1_700_000_000_000, "3.11", "installed-py3.11-torch2.13.0", {})
    add(res, OTHER, [1.5])
    write_suite(tmp_path, [OTHER])
    write_machine(tmp_path, "box")
    res.save(str(tmp_path))
    markdown = summary_markdown(read_results(tmp_path))
    section = markdown.split("## Calibration", 1)[1].split("\n## ", 1)[0]
    assert "No run has measured these checks yet" in section
    assert " pass |" not in section and " fail |" not in section
    assert "## Uncalibrated figures" in markdown and "`bench_loss.Step.track_made_up_figure`" in markdown


def test_pitfalls_report_writes_the_table_and_does_not_mark_the_errors_uncalibrated(tmp_path):
    plant(tmp_path / "results", "box", "a" * 40, 1_700_000_000_000, PLANTED)
    done = subprocess.run([str(PITFALLS), "report", "--results", str(tmp_path / "results"), "--out",
                           str(tmp_path / "report")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    markdown = (tmp_path / "report" / "README.md").read_text()
    rows = table_rows(markdown)
    assert rows["speedup: 2T against T"]["`box`"] == "30.0 % fail"
    assert markdown.count("| check | calibrates | tolerance |") == 1  # one calibration table
    uncalibrated = markdown.split("## Uncalibrated figures", 1)[1]
    assert "`bench_loss.Step.track_made_up_figure`" in uncalibrated
    assert "track_error" not in uncalibrated
    # The errors are the calibration table's, not a family table of their own.
    assert "#### calibration" not in markdown

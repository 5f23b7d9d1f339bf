"""The loader's ladder table: read from a results file, and the README's table is that file's output."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from pitfalls.families.loader.ladder import COLUMNS, ladder_lines, main, rows_of_file
from pitfalls.report.rows import OK, SKIPPED, Row

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"^<!-- loader ladder: (\S+) -->$")


def test_the_readme_tables_are_the_output_of_the_results_files_they_name() -> None:
    readme = (ROOT / "README.md").read_text().splitlines()
    marked = [(i, MARKER.match(line)) for i, line in enumerate(readme)]
    tables = [(i, match.group(1)) for i, match in marked if match]
    assert tables, "the README has no loader ladder table"
    for at, name in tables:
        expected = ladder_lines(rows_of_file(ROOT / name))
        assert len(expected) > 3, name
        assert readme[at + 1:at + 1 + len(expected)] == expected, (
            f"README's table after line {at + 1} is not the output of "
            f"`python -m pitfalls.families.loader.ladder {name}`")


def _row(benchmark: str, value: float | None, **params: Any) -> Row:
    named = {"variant": "naive", "num_workers": 0, "cache": "warm", "device": "cpu", **params}
    return Row(machine="m", commit="c" * 40, commit_date=None, measured_at=None, env="e", torch="2.13.0",
               family="loader", benchmark=benchmark, kind="track", unit="x", params=named, value=value,
               status=OK if value is not None else SKIPPED)


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def test_a_line_per_rung_and_cache_with_its_workers_and_the_ratio_over_naive() -> None:
    samples, speedup = COLUMNS[0].benchmark, COLUMNS[1].benchmark
    wait, starves = COLUMNS[3].benchmark, COLUMNS[4].benchmark
    rows = [
        _row(samples, 100.0), _row(samples, 150.0, num_workers=2),
        _row(samples, 400.0, variant="uint8"), _row(samples, None, variant="uint8", num_workers=2),
        _row(speedup, 1.0), _row(speedup, 1.02, num_workers=2),
        _row(speedup, 3.5, variant="uint8"), _row(speedup, 2.0, variant="uint8", num_workers=2),
        _row(wait, 0.5, model_ms=0), _row(wait, 0.9, model_ms=10),  # a planted step is another question
        _row(starves, 12.0, model_ms=0),
        _row(samples, None, variant="ram_decoded", cache="cold"), _row(speedup, None, variant="ram_decoded",
                                                                        cache="cold"),
        _row(samples, 7.0, device="cuda"),  # results of a CPU machine: not read (rows_of_file's filter)
    ]
    lines = ladder_lines([r for r in rows if r.params["device"] == "cpu"])
    assert lines[0].startswith("| rung | cache | samples/s, 0 / 2 workers |")
    naive = next(line for line in lines if line.startswith("| `naive` | warm |"))
    uint8 = next(line for line in lines if line.startswith("| `uint8` | warm |"))
    assert _cells(naive)[2:7] == ["100 / 150", "1.00 / 1.02", "1.00 / 1.00", "0.50 / n/a", "12.0 / n/a"]
    # A figure not measured is n/a, never 0, and a ratio of it is n/a too.
    assert _cells(uint8)[2:5] == ["400 / n/a", "3.50 / 2.00", "4.00 / n/a"]
    assert not any(line.startswith("| `ram_decoded`") for line in lines)
    assert lines[-1] == "No figure on this machine (n/a in every column): `ram_decoded` (cache=cold)."
    assert ladder_lines([_row("bench_loss.Step.time_step", 1.0)]) == []


def test_a_path_that_is_not_a_results_file_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str],
                                                                  tmp_path: Path) -> None:
    for bad in (tmp_path / "nothing.json", ROOT / "README.md"):
        assert main([str(bad)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and str(bad) in err and "<commit>-<env>.json" in err, err

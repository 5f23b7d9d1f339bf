"""A comparison whose own code path did not run never passes (`Comparison.stand_in`, `Comparison.not_run`)."""

from __future__ import annotations

import math

import pytest

from pitfalls import cli
from pitfalls.family import Comparison


def test_a_row_with_a_stand_in_cannot_pass():
    with pytest.raises(ValueError, match="a row whose own code path did not run cannot pass"):
        Comparison("loader", "gpu_decode", "cpu", True, 0.0, stand_in="opencv_decoder")
    with pytest.raises(ValueError, match="not run: no CUDA"):
        Comparison("loader", "gpu_decode", "cpu", True, 0.0, skipped="no CUDA")
    failed = Comparison("loader", "gpu_decode", "cpu", False, 3.0, "jpeg: masks differ", stand_in="opencv_decoder")
    assert failed.stand_in == "opencv_decoder" and not failed.matches


def test_not_run_records_the_stand_in_and_reads_nan():
    row = Comparison.not_run("loader", "gpu_decode", "cpu", "no decoder", stand_in="opencv_decoder")
    assert (row.matches, row.skipped, row.stand_in) == (False, "no decoder", "opencv_decoder")
    assert math.isnan(row.max_abs_diff)


def test_check_prints_a_stand_in_row_as_not_run_and_still_exits_zero(monkeypatch, capsys):
    rows = [Comparison("f", "own", "cpu", True, 0.0),
            Comparison.not_run("f", "decoded", "cpu", "the device decoder cannot run", stand_in="opencv_decoder")]
    monkeypatch.setattr(cli, "check_all", lambda devices, families=None: rows)
    monkeypatch.setattr(cli, "sync_columns", lambda *args: ("0", "n/a"))
    assert cli.main(["check", "--device", "cpu"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "not run here: the device decoder cannot run" in out
    assert "all 1 variant runs match naive; 1 not run here: f/decoded on cpu" in out

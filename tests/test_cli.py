"""The command line: list, check (exit status tells whether every variant matches naive)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pitfalls import cli, registry
from pitfalls.devices import cuda_available


def test_list_names_every_variant(capsys):
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    for family in registry.families():
        assert family in out
        for variant in registry.variants(family):
            assert variant in out


def test_check_prints_a_row_per_variant_and_exits_zero(capsys):
    assert cli.main(["check", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if " cpu " in line]
    assert len(rows) == sum(len(registry.variants(f)) for f in registry.families())
    assert all(" yes " in row for row in rows)


def test_check_exits_nonzero_when_a_variant_differs(capsys, monkeypatch):
    from pitfalls.families import loss

    class Broken(loss.WhereLoss):
        def compute(self, pred, target):
            return 1.01 * super().compute(pred, target)

    monkeypatch.setitem(loss.VARIANTS, "where", Broken)
    assert cli.main(["check", "--device", "cpu"]) == 1
    assert "loss/where on cpu" in capsys.readouterr().out


@pytest.mark.skipif(cuda_available(), reason="this machine has a CUDA device, so cuda is not absent")
def test_check_on_an_absent_device_says_so():
    done = subprocess.run(
        [sys.executable, "-m", "pitfalls.cli", "check", "--device", "cuda"], capture_output=True, text=True
    )
    assert done.returncode == 2
    assert "device cuda is not available here; available: cpu" in done.stdout



def test_check_shows_sync_hazards_per_variant(capsys):
    assert cli.main(["check", "--device", "cpu"]) == 0
    rows = {line.split("│")[2].strip(): line for line in capsys.readouterr().out.splitlines() if " cpu " in line}
    hazards = {variant: int(row.split("│")[6]) for variant, row in rows.items()}
    assert hazards["naive"] > 0 and hazards["nonzero"] > 0
    assert hazards["ignore_index"] == 0 and hazards["static"] == 0


@pytest.mark.skipif(cuda_available(), reason="checks the reasons printed where there is no CUDA device")
def test_probe_prints_real_figures_and_reasons_for_the_rest(capsys, tmp_path):
    trace = tmp_path / "naive.json"
    assert cli.main(["probe", "loss", "naive", "--batch", "1", "--image-size", "16", "--rounds", "2",
                     "--trace", str(trace)]) == 0
    out = capsys.readouterr().out
    assert "time per call" in out and "aten.nonzero.default" in out
    assert "unavailable: no CUDA device" in out
    assert "unavailable: NVML library not found" in out or "unavailable: case runs on cpu" in out
    assert trace.exists()


def test_probe_refuses_an_unknown_variant(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["probe", "sampler", "naive"])
    assert exit_.value.code == 2
    assert "sampler variant 'naive' is not known; allowed: nonzero, static" in capsys.readouterr().err


def test_report_on_a_missing_results_folder_says_so(tmp_path, capsys):
    assert cli.main(["report", "--results", str(tmp_path / "none"), "--out", str(tmp_path / "report")]) == 2
    assert "is not a folder" in capsys.readouterr().out
    assert not (tmp_path / "report").exists()

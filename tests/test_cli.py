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
    from pitfalls import loss

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


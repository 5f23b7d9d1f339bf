"""The main job's equivalence gate proves the families a ``-b`` selection can measure, and every family otherwise."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pitfalls.registry import all_families
from pitfalls.runner.gate import gated_families

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.mark.parametrize(("args", "families"), [
    ([], None),
    (["--show-stderr"], None),
    (["-b", r"bench_sampler\.SyncHazards\.track_sync_hazards\('static', 1000, 1, 'cpu'\)"], ("sampler",)),
    (["-b", "bench_loss", "--bench=^bench_sampler.Speedup", "-b", "bench_loss.Step"], ("loss", "sampler")),
    (["--bench", "bench_calibration"], ("calibration",)),
    # Expressions that may select another family's benchmarks: every family is proved.
    (["-b", "SyncHazards"], None),
    (["-b", "bench_loss", "-b", "Speedup"], None),
    (["-b", "bench_loss|bench_sampler"], None),
    (["-b", "bench_lo"], None),
    (["-b", "bench_plugins"], None),
    (["-b", ".*"], None),
    (["-bbench_loss"], None),
    (["-b"], None),
])
def test_the_gate_proves_what_the_selection_can_measure(args: list[str], families: tuple[str, ...] | None) -> None:
    assert gated_families(args, BENCHMARKS) == families


def test_a_module_whose_name_extends_another_s_proves_every_family(tmp_path: Path) -> None:
    for name in ("bench_loss", "bench_loss_extra"):
        (tmp_path / f"{name}.py").write_text("")
    assert gated_families(["-b", "bench_loss.Step"], tmp_path) is None
    assert gated_families(["-b", r"bench_loss_extra\.Step"], tmp_path) == ("loss_extra",)


def test_every_family_with_a_module_of_its_own_is_registered() -> None:
    # A family the gate names must be one `pitfalls check --family` accepts.
    modules = {path.stem.removeprefix("bench_") for path in BENCHMARKS.glob("bench_*.py")} - {"plugins"}
    assert modules <= set(all_families())


def test_check_of_one_family_runs_only_its_variants_and_refuses_an_unknown_one() -> None:
    done = subprocess.run([sys.executable, "-m", "pitfalls.cli", "check", "--family", "sampler"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"all {len(all_families()['sampler'].variants)} variant runs match naive" in done.stdout
    assert "loss" not in done.stdout.split("┡")[-1].split("sync hazards:")[0]
    bad = subprocess.run([sys.executable, "-m", "pitfalls.cli", "check", "--family", "nope"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "invalid choice: 'nope'" in bad.stderr.strip().splitlines()[-1]

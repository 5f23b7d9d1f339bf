"""`pitfalls doctor --try`: DataLoader settings applied from outside, the trials' table, the choice of settings and
the batches' sameness. The speedup against the loader family's own is a calibration row (`pitfalls calibrate`)."""

from __future__ import annotations

import json

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from pitfalls import cli
from pitfalls.doctor import try_checks
from pitfalls.doctor.options import DoctorOptions
from pitfalls.doctor.report import LoaderFigures
from pitfalls.doctor.run import run_doctor
from pitfalls.doctor.try_child import Trial, applied, describe, parse_setting
from pitfalls.doctor.try_settings import DIGESTS, choose, trial_steps, try_settings

QUICK = DoctorOptions(warmup=1, steps=2, scanned=1, digests=DIGESTS)


def loader(workers: int, verdict: str = "loader-bound", wait_ms: float = 40.0) -> LoaderFigures:
    return LoaderFigures(wait_share=0.8, ms_per_step=wait_ms, verdict=verdict, batch_bytes=None, batches_per_step=1.0,
                         workers=workers, anatomy=())


def test_a_setting_is_read_from_the_command_line_or_refused_in_one_line():
    assert parse_setting("num_workers=2, pin_memory=True") == {"num_workers": 2, "pin_memory": True}
    assert describe(parse_setting("prefetch_factor=4,persistent_workers=False")) == \
        "prefetch_factor=4,persistent_workers=False"
    for bad, message in (("workers=2", "'workers=2' is not a DataLoader setting; allowed: num_workers=..."),
                         ("num_workers=-1", "num_workers='-1' is not allowed; num_workers takes an int >= 0"),
                         ("pin_memory=yes", "pin_memory='yes' is not allowed; pin_memory takes True or False")):
        with pytest.raises(ValueError, match="^" + message.replace("(", "\\(").replace(".", "\\.")):
            parse_setting(bad)


def test_a_setting_overrides_every_dataloader_built_inside_the_block():
    data = TensorDataset(torch.arange(8.0))
    with applied({"num_workers": 2, "persistent_workers": True}):
        made = DataLoader(data, 4, False, num_workers=0)
    assert (made.num_workers, made.persistent_workers, made.prefetch_factor) == (2, True, 2)
    with applied({"num_workers": 0}):  # what needs workers goes, as DataLoader refuses it without them
        made = DataLoader(data, batch_size=4, num_workers=2, prefetch_factor=4, persistent_workers=True)
    assert (made.num_workers, made.persistent_workers, made.prefetch_factor) == (0, False, None)
    assert DataLoader(data, num_workers=1).num_workers == 1  # restored after the block


def test_loader_chooses_the_workers_that_hide_the_wait_and_all_the_cores():
    # 40 ms of wait, 10 ms of the rest: four workers would hide it; on 2 cores, 2.
    assert choose(loader(0), 50.0, False, 2) == ([{"num_workers": 2, "persistent_workers": True}], "")
    settings, _ = choose(loader(0), 50.0, True, 8)
    assert settings == [{"num_workers": n, "persistent_workers": True, "pin_memory": True} for n in (4, 8)]
    assert choose(loader(2, "step-bound", 1.0), 50.0, False, 8) == (
        [], "the loader keeps up with the step (step-bound, 2 workers)")
    assert choose(None, 50.0, False, 8)[1] == "the timed steps took no batch from a DataLoader"


def test_every_trial_times_the_steady_state_of_the_setting_with_the_most_workers():
    # Two workers with prefetch 2 hold 6 batches ahead: 6 more warm-up steps, and ten times as many timed.
    assert trial_steps(DoctorOptions(), [(0, 2), (2, 2)]) == (3 + 6, 60)
    assert trial_steps(DoctorOptions(), [(0, 2)]) == (3, 10)


@pytest.fixture(scope="module")
def report():
    return run_doctor(try_checks.LOADER_SCRIPT, ["--item-ms", "0", "--step-ms", "0"], QUICK)


def fake(results: dict[str, dict]):
    asked: list[Trial] = []

    def run(trial: Trial) -> dict:
        asked.append(trial)
        return results[describe(trial.setting)]

    return run, asked


def test_the_table_ranks_the_fastest_setting_with_the_same_batches_as_the_fix(report):
    own = list(report.digests)
    assert len(own) == DIGESTS
    run, asked = fake({
        "as written": {"mean_ms": 50.0, "median_ms": 50.0, "wait_share": 0.8, "workers": 0, "digests": own},
        "num_workers=1": {"mean_ms": 40.0, "median_ms": 40.0, "wait_share": 0.6, "workers": 1, "digests": own},
        "num_workers=2": {"mean_ms": 20.0, "median_ms": 20.0, "wait_share": 0.5, "workers": 2,
                          "digests": own[:1] + ["other"] * 3},
    })
    tried = try_settings(report, QUICK, [{"num_workers": 1}, {"num_workers": 2}], run=run)
    assert [t.setting for t in asked] == [{}, {"num_workers": 1}, {"num_workers": 2}]
    assert {(t.warmup, t.steps) for t in asked} == {tried.steps} and tried.steps == (1 + 6, 60)
    rows = {row.setting: row for row in tried.rows}
    assert [rows[s].speedup for s in rows] == [1.0, 1.25, 2.5]
    assert [rows[s].same_batches for s in rows] == [True, True, False]  # the fastest changes the batches
    assert tried.best is rows["num_workers=1"] and tried.note == ""
    assert rows["num_workers=2"].as_json()["same_batches"] is False


def test_batches_that_differ_from_run_to_run_are_not_judged(report):
    run, _ = fake({"as written": {"mean_ms": 50.0, "workers": 0, "digests": ["elsewhere"] * DIGESTS},
                   "num_workers=2": {"mean_ms": 20.0, "workers": 2, "digests": ["elsewhere"] * DIGESTS}})
    tried = try_settings(report, QUICK, [{"num_workers": 2}], run=run)
    assert tried.note == "the script's own batches differ from run to run (unseeded?): same batches not judged"
    assert [row.same_batches for row in tried.rows] == [None, None] and tried.best is None


def test_a_failed_trial_is_a_row_with_its_reason(report):
    run, _ = fake({"as written": {"mean_ms": 50.0, "workers": 0, "digests": list(report.digests)},
                   "num_workers=2": {"failure": "the trial failed: RuntimeError: no"}})
    (_, failed) = try_settings(report, QUICK, [{"num_workers": 2}], run=run).rows
    assert (failed.speedup, failed.same_batches, failed.note) == (None, None, "the trial failed: RuntimeError: no")


def test_try_runs_fresh_processes_and_says_an_augmentation_changes_the_batches(capsys):
    code = cli.main(["doctor", "--warmup", "1", "--steps", "2", "--scanned", "1", "--json", "--try",
                     "num_workers=2", str(try_checks.LOADER_SCRIPT), "--", "--item-ms", "1", "--step-ms", "1",
                     "--augment"])
    assert code == 0
    rows = json.loads(capsys.readouterr().out)["try"]
    assert [(r["setting"], r["workers"], r["same_batches"], r["fix"]) for r in rows] == [
        ("as written", 0, True, False), ("num_workers=2", 2, False, False)]
    assert all(set(r) >= {"setting", "step_ms", "wait_share", "speedup", "same_batches"} for r in rows)
    assert rows[0]["speedup"] == 1.0 and rows[1]["speedup"] > 0


def test_a_bad_try_is_one_error_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as stopped:
        cli.main(["doctor", "--try", "workers=2", str(try_checks.LOADER_SCRIPT)])
    assert stopped.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("pitfalls doctor: error: argument --try: 'workers=2' is not a DataLoader setting")

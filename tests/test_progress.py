"""The main job's progress and its time table, read from asv's output and durations (a fake clock, planted files)."""

from __future__ import annotations

import io
from pathlib import Path

from asv.results import Results
from asv.runner import BenchmarkResult
from asv_results import write_machine

from pitfalls.asv_files import file_name
from pitfalls.runner.progress import Durations, Progress, durations_of, newest_durations, time_table


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def planted(results_dir: Path, machine: str, commit: str, date: int, durations: dict[str, float],
            caches: dict[str, float]) -> Path:
    """A results file and its machine.json written by asv's own API, with planted durations; returns its path."""
    env_name = "installed-py3.11-torch2.13.0"
    res = Results({"machine": machine}, {}, commit, date, "3.11", env_name, {})
    for name, seconds in durations.items():
        outcome = BenchmarkResult(result=[1.0], samples=[None], number=[None], errcode=0, stderr="", profile=None)
        res.add_result({"name": name, "version": "v", "params": []}, outcome, duration=seconds)
    for module, seconds in caches.items():
        res.set_setup_cache_duration(f"{module}:12", seconds)
    res.save(str(results_dir))
    write_machine(results_dir, machine)
    return results_dir / file_name(machine, commit, env_name)


EXPECTED = Durations({"bench_loss.Step.time_step": 20.0, "bench_calibration.Error.track_error": 190.0,
                      "bench_sampler.Speedup.track_speedup": 60.0}, {"bench_sampler": 30.0}, "results/m/x.json")


def test_a_silent_asv_gets_a_status_line_with_what_runs_and_the_time_left() -> None:
    clock, out = Clock(), io.StringIO()
    progress = Progress(EXPECTED, out=out, heartbeat_s=30, clock=clock)
    progress.line("[ 33.33%] ··· Running (bench_calibration.Error.track_error--).")
    clock.now = 10
    progress.line("[ 33.33%] ··· bench_loss.Step.time_step                    ok")
    assert progress.running == "bench_sampler.Speedup.track_speedup"  # the next in asv's order
    progress.line("[ 33.33%] ··· Running (bench_calibration.Error.track_error--).")
    clock.now = 25
    assert not progress.beat()  # asv spoke 15 s ago
    clock.now = 70
    assert progress.beat()
    status = out.getvalue().splitlines()[-1]
    # 190 - 60 s of the one running, 60 s of the one to come, 30 s of the sampler's setup cache: 220 s left.
    assert status == ("== 70 s in: bench_calibration.Error.track_error for 60 s, 1 of 3 benchmarks done, about 4 min "
                      "left by the durations of x.json")
    assert progress.left_s() == 220
    assert "··· bench_loss.Step.time_step" in out.getvalue().splitlines()[1]  # asv's own lines pass through


def test_with_no_earlier_run_it_says_so_rather_than_guess() -> None:
    progress = Progress(Durations(), out=io.StringIO(), clock=Clock())
    assert progress.left_s() is None and "no earlier run to say how long is left" in progress.status()


def test_follow_passes_every_line_and_ends_its_heartbeat() -> None:
    out = io.StringIO()
    Progress(EXPECTED, out=out, heartbeat_s=0.01).follow(iter(["a\n", "b\n"]))
    assert out.getvalue().splitlines()[:2] == ["a", "b"]


def test_the_time_table_and_the_newest_run_by_commit_date(tmp_path: Path) -> None:
    old = planted(tmp_path, "m", "a" * 40, 1, {"bench_loss.Step.time_step": 1}, {})
    new = planted(tmp_path, "m", "b" * 40, 2,
                  {"bench_loss.Step.time_step": 22.4, "bench_loss.Speedup.track_speedup": 54.2,
                   "bench_calibration.Error.track_error": 190.1}, {"bench_loss": 36.3})
    old.touch()  # the newest file on disk is not the newest run: a fresh clone gives every file one time
    assert newest_durations(tmp_path, "m", "installed-*").source == str(new)
    assert newest_durations(tmp_path, "another", "installed-*").source == str(new)
    table = time_table(durations_of(new), slowest=2)
    assert table[2:4] == ["| calibration | 190 |", "| loss | 113 |"]
    assert table[4] == "| all (3 benchmarks, setup caches included) | 303 |"
    assert table[-2:] == ["| `bench_calibration.Error.track_error` | 190 |",
                          "| `bench_loss.Speedup.track_speedup` | 54 |"]
    assert durations_of(tmp_path / "missing.json") == Durations(source=str(tmp_path / "missing.json"))

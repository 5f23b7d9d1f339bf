"""Pinned asv versions hold only with the method hash recorded next to them (pitfalls.series_guard)."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pitfalls import series_guard

ROOT = Path(__file__).resolve().parents[1]


def series(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """Run the series command (``python -m pitfalls.series_guard``) in a fresh interpreter, as scripts/series does."""
    return subprocess.run([sys.executable, "-m", "pitfalls.series_guard", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=600)


@pytest.fixture
def suite_copy(tmp_path: Path) -> Path:
    """A copy of the benchmark folder, to plant a change of method in."""
    copy = tmp_path / "benchmarks"
    shutil.copytree(ROOT / "benchmarks", copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def test_every_pinned_series_holds_its_method():
    done = series("check")
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    pins = series_guard.load_pins()
    assert f"{len(pins)} of {len(pins)} pinned series hold their method" in done.stdout


def test_a_helper_changed_under_a_pin_fails_with_what_to_do(suite_copy: Path):
    # The case of track_compile_seconds: a helper of its class's shape, outside asv's own hash, changes.
    shapes = suite_copy / "shapes.py"
    source = shapes.read_text()
    planted = source.replace("return measure.compile_table(self.family, self.param_names, self.params, sweep)",
                             "return measure.compile_table(self.family, self.param_names, self.params, None)")
    assert planted != source
    shapes.write_text(planted)
    done = series("check", "--benchmarks", str(suite_copy))
    assert done.returncode == 1
    drifted = sorted(line.split(":")[0] for line in done.stdout.splitlines() if "its method changed" in line)
    # Exactly the benchmarks whose setup_cache reaches it, none of the others.
    assert drifted == ["bench_loss.Compile.track_compile_seconds", "bench_loss.Compile.track_graph_breaks",
                       "bench_sampler.Compile.track_compile_seconds", "bench_sampler.Compile.track_graph_breaks",
                       "bench_sampler.Compile.track_recompiles"]
    message = done.stdout.splitlines()[0]
    assert "give it a new version, so its series restarts: `scripts/series restart bench_loss.Compile." in message
    assert "record the new hash: `scripts/series record bench_loss.Compile.track_compile_seconds`" in message


def test_a_comment_is_not_a_change_of_method(suite_copy: Path):
    shapes = suite_copy / "shapes.py"
    shapes.write_text(shapes.read_text().replace("        return self.figures.recompiles\n",
                                                 "        return self.figures.recompiles  # a comment\n"))
    done = series("check", "--benchmarks", str(suite_copy))
    assert done.returncode == 0, done.stdout


def test_the_measuring_layer_is_part_of_the_method(monkeypatch: pytest.MonkeyPatch):
    # pitfalls.measure holds what a published figure is: a change there drifts the series that reach it.
    from pitfalls import measure

    [benchmark] = series_guard.discovered(["bench_loss.Compile.track_compile_seconds"]).values()
    [hazards] = series_guard.discovered(["bench_loss.SyncHazards.track_sync_hazards"]).values()
    before = series_guard.method_hash(benchmark), series_guard.method_hash(hazards)

    def cold_compile_cache():  # noqa: ANN202 - a planted change of the helper's code
        return contextlib.nullcontext()

    monkeypatch.setattr(measure, "cold_compile_cache", cold_compile_cache)
    after = series_guard.method_hash(benchmark), series_guard.method_hash(hazards)
    assert after[0] != before[0] and after[1] == before[1]


def test_the_family_module_is_part_of_the_method():
    from pitfalls.families import loss

    found = [m.__name__ for m in series_guard.family_modules("loss")]
    assert found == [loss.__name__]


def test_record_and_restart_rewrite_the_pins_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]):
    pins_file = tmp_path / "series.json"
    shutil.copy(series_guard.PINS_FILE, pins_file)
    monkeypatch.setattr(series_guard, "PINS_FILE", pins_file)
    name = "bench_loss.Step.time_step"
    before = series_guard.load_pins(pins_file)[name]
    raw = json.loads(pins_file.read_text())
    raw[name]["method"] = "0" * 64
    pins_file.write_text(json.dumps(raw))
    assert series_guard.main(["record", name]) == 0
    recorded = series_guard.load_pins(pins_file)[name]
    assert (recorded.version, recorded.method) == (before.version, before.method)
    assert series_guard.main(["restart", name, "--commit", "abc12345", "--why", "planted"]) == 0
    assert "python -m pitfalls.suite_description --write" in capsys.readouterr().out
    restarted = series_guard.load_pins(pins_file)[name]
    assert restarted.version == before.method != before.version
    assert restarted.restarts == ({"commit": "abc12345", "previous": before.version, "why": "planted"},)


def test_an_unknown_name_is_one_line_and_exit_2():
    done = series("record", "bench_loss.Nope.track_nothing")
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1
    assert "not a pinned benchmark: bench_loss.Nope.track_nothing; allowed: bench_" in done.stderr
    assert "bench_loss.Compile.track_compile_seconds" in done.stderr


def _unpinned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """A copy of the pins file with ``name``'s pin taken out (a benchmark added since), in use for the test."""
    pins_file = tmp_path / "series.json"
    raw = json.loads(series_guard.PINS_FILE.read_text())
    del raw[name]
    pins_file.write_text(json.dumps(raw))
    monkeypatch.setattr(series_guard, "PINS_FILE", pins_file)


def test_pin_keeps_the_version_asv_reads_and_records_its_method(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # Before a benchmark's code moves: its version is pinned as it is, so the move cannot restart its series.
    name = "bench_loader.BatchBytes.track_bytes_per_batch"
    _unpinned(tmp_path, monkeypatch, name)
    benchmark = series_guard.discovered([name])[name]
    assert series_guard.main(["pin", name]) == 0
    pin = series_guard.load_pins()[name]
    assert (pin.version, pin.method, pin.restarts) == (benchmark.version, series_guard.method_hash(benchmark), ())
    with pytest.raises(SystemExit) as exit_:
        series_guard.main(["pin", "bench_loader.Nope.track_nothing"])
    assert exit_.value.code == 2


def test_restart_pins_a_benchmark_that_had_asvs_own_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # A benchmark not pinned yet (its version asv's own hash): a change of method restarts it the same way.
    name = "bench_loader.BatchBytes.track_bytes_per_batch"
    _unpinned(tmp_path, monkeypatch, name)
    assert name not in series_guard.load_pins()
    asv_version = series_guard.discovered([name])[name].version
    assert series_guard.main(["restart", name, "--commit", "abc12345", "--why", "planted"]) == 0
    pin = series_guard.load_pins()[name]
    assert pin.version == pin.method != asv_version
    assert pin.restarts == ({"commit": "abc12345", "previous": asv_version, "why": "planted"},)
    with pytest.raises(SystemExit) as exit_:
        series_guard.main(["restart", "bench_loader.Nope.track_nothing", "--commit", "c", "--why", "w"])
    assert exit_.value.code == 2

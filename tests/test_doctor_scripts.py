"""`pitfalls doctor` on plain scripts: AdamW without hazards, a loop with no optimizer, a script that raises, one
that never steps, bad input, and the command through ``python -m pitfalls``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from rich.console import Console

from pitfalls import cli
from pitfalls.doctor import DoctorOptions, run_doctor
from pitfalls.doctor.render import render

EXAMPLES = Path(__file__).resolve().parent / "doctor_examples"
QUICK = DoctorOptions(warmup=2, steps=3, scanned=5, memory=1)


def line_of(path: Path, text: str) -> int:
    found = [n for n, line in enumerate(path.read_text().splitlines(), start=1) if text in line]
    assert len(found) == 1, (text, found)
    return found[0]


def no_children() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True) if p.name() != "resource_tracker"
            and "resource_tracker" not in " ".join(p.cmdline())]


@pytest.mark.parametrize("foreach", [False, True])
def test_adamw_without_hazards_reports_no_sync(foreach):
    args = ["--lr", "1e-3", *(["--foreach"] if foreach else [])]
    report = run_doctor(EXAMPLES / "adamw_clean.py", args, QUICK)
    assert report.steps.total == 12 and report.steps.counted_by == "optimizer"
    assert [f for f in report.findings if f.kind == "sync"] == []
    # Memory is sampled in a step of its own: the sampler takes a core that the timed steps would wait for.
    assert report.steps.memory == 1 and report.memory.detail.startswith("over 1 steps after the scanned ones")
    assert report.steps.scanned == 5 and report.failure is None


def test_a_loop_without_an_optimizer_is_counted_by_its_batches_and_forks_no_instrument(tmp_path):
    marker = tmp_path / "marker"
    path = EXAMPLES / "loader_only.py"
    report = run_doctor(path, [str(marker)], QUICK)
    assert report.steps.counted_by == "loader" and report.steps.total == 12
    # Every epoch forks its workers again, several in the scanned steps: none started under an instrument.
    assert marker.read_text() == "modes 0"
    line = line_of(path, "total += values.to(device).sum().item()")
    found = sorted((f.title, f.per_step) for f in report.finding_at("sync", str(path), line))
    assert found == [(".item()", 1.0), ("host-to-device copy (.to(device))", 1.0)]
    assert report.loader is not None and report.loader.workers == 2 and report.loader.batches_per_step == 1.0
    assert no_children() == []  # the script's workers are gone


def test_a_script_that_raises_gets_the_report_the_last_line_and_the_step(tmp_path, capsys):
    marker = tmp_path / "marker"
    code = cli.main(["doctor", "--json", str(EXAMPLES / "raises.py"), "--", str(marker)])
    assert code == 1
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert data["error"] == {"last_line": "ValueError: planted failure in step 5", "step": 5, "hint": None}
    # The script's traceback follows on stderr, from its own first frame.
    assert captured.err.startswith("Traceback") and "raises.py" in captured.err.splitlines()[1]
    assert data["steps"]["total"] == 4 and data["steps"]["measured"] == 1
    assert marker.read_text() == "finally ran in step 5"


def test_a_stopped_script_runs_its_finally_blocks(tmp_path):
    marker = tmp_path / "marker"
    report = run_doctor(EXAMPLES / "loader_only.py", [str(marker)],
                        DoctorOptions(warmup=1, steps=1, scanned=1, memory=1))
    assert report.ended == "stopped: its 5 steps are done" and marker.read_text() == "modes 0"


def test_a_script_that_never_steps_is_stopped_by_the_budget_and_says_so(tmp_path):
    script = tmp_path / "idle.py"
    script.write_text("import time\nwhile True:\n    time.sleep(0.01)\n")
    report = run_doctor(script, (), DoctorOptions(budget_s=1.0))
    assert report.ended == "stopped: the budget of 1 s was spent"
    assert report.steps.total == 0 and report.steps.counted_by is None and report.findings == ()
    assert "step time and the loader's wait: no step was timed" in report.not_measured


def test_a_missing_argument_is_the_scripts_own_exit_and_fails_the_run(capsys):
    code = cli.main(["doctor", str(EXAMPLES / "adamw_clean.py")])
    captured = capsys.readouterr()
    assert code == 1 and "the following arguments are required: --lr" in captured.err
    assert "the script failed before its first step: SystemExit: 2" in captured.out


@pytest.mark.parametrize(("make", "message"), [
    (lambda tmp: tmp / "absent.py", "does not exist"),
    (lambda tmp: tmp, "is not a file"),
    (lambda tmp: _write(tmp / "broken.py", "def f(:\n    pass\n"), "is not valid Python: line 1"),
])
def test_bad_scripts_get_one_line_and_exit_2(tmp_path, capsys, make, message):
    path = make(tmp_path)
    assert cli.main(["doctor", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("pitfalls doctor: SCRIPT") and message in err[0]
    assert str(path) in err[0]


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.mark.parametrize("argv", [["--steps", "0"], ["--budget", "-1"], ["--warmup", "x"]])
def test_bad_options_are_one_line_and_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as stopped:
        cli.main(["doctor", *argv, str(EXAMPLES / "adamw_clean.py")])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("pitfalls doctor: error: argument")


def test_python_m_pitfalls_doctor_runs_the_script_as_main_with_its_arguments(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "pitfalls", "doctor", "--warmup", "1", "--steps", "2", "--scanned", "1", "--json",
         str(EXAMPLES / "adamw_clean.py"), "--", "--lr", "1e-3"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads(done.stdout)
    assert data["argv"] == ["--lr", "1e-3"] and data["steps"]["total"] == 10
    assert data["ended"] == "stopped: its 10 steps are done"


def test_real_syncs_are_counted_at_the_line_that_warned_and_other_warnings_pass_on():
    import warnings

    from fakes import FakeCuda

    from pitfalls.doctor.real_syncs import RealSyncs
    from pitfalls.probes.syncs import CUDA_SYNC_WARNING

    fake = FakeCuda()
    passed: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = lambda message, *_args, **_kwargs: passed.append(str(message))
        with RealSyncs(cuda=fake) as real:
            assert fake.mode == 1
            for _ in range(2):
                warnings.warn(f"{CUDA_SYNC_WARNING} (the first line)", UserWarning, stacklevel=1)  # 2 a step, 2 steps
            warnings.warn(f"{CUDA_SYNC_WARNING} (the second line)", UserWarning, stacklevel=1)
            warnings.warn("a warning of the script's own", UserWarning, stacklevel=1)
        assert fake.mode == 0  # the mode it found is back
    here = line_of(Path(__file__), "(the first line)\", UserWarning, stacklevel=1)")
    lines = real.per_line(steps=2)
    assert lines[(__file__, here)][0] == 1.0 and lines[(__file__, here + 1)][0] == 0.5
    assert passed == ["a warning of the script's own"]


def test_the_gpu_phase_runs_and_reaches_the_report_with_cuda_faked(monkeypatch, tmp_path):
    # The GPU branch cannot run on a CPU; with torch.cuda's calls faked, its plumbing can: a phase of S more steps
    # under RealSyncs, the per-line rows, the agreement, the bandwidth cells and the costs it gives the findings.
    import torch
    from fakes import FakeCuda

    from pitfalls.doctor import copies, phases, real_syncs
    from pitfalls.doctor import run as run_module
    from pitfalls.doctor.copies import DEVICE_TO_HOST, HOST_TO_DEVICE

    fake = FakeCuda()
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", fake.synchronize)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: 1 << 20)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(phases, "RealSyncs", lambda clock: real_syncs.RealSyncs(clock, cuda=fake))
    rates = tuple((d, p, 10e9 if p else 5e9) for d in (HOST_TO_DEVICE, DEVICE_TO_HOST) for p in (False, True))
    monkeypatch.setattr(run_module, "copy_bandwidth", lambda device: copies.Bandwidth(str(device), rates))
    path = EXAMPLES / "loader_only.py"
    report = run_doctor(path, [str(tmp_path / "marker")], QUICK)
    assert report.steps.gpu == 5 and report.steps.total == 16
    assert report.memory.source == "CUDA allocator" and report.memory.peak_bytes == 1 << 20
    line = line_of(path, "total += values.to(device).sum().item()")
    (row,) = [r for r in report.real_syncs if r.line == line]
    assert (row.real_per_step, row.hazards_per_step) == (0.0, 2.0)  # nothing really synced on the CPU
    assert report.syncs_agree is False
    assert dict(report.bandwidth)["host to device, pinned"] == 10.0
    syncs = report.finding_at("sync", str(path), line)
    assert syncs and all(f.ms_per_step == 0.0 and f.cost.startswith("measured") for f in syncs)
    assert not any("no GPU" in line for line in report.not_measured)


@pytest.mark.parametrize(("script", "lines"), [
    ("two_adams.py", ("optimizer_d.step()", "optimizer_g.step()")),
    ("numpy_batches.py", ("x = torch.stack(", "x, y = x.to(DEVICE), y.to(DEVICE)")),
    ("batch_ahead.py", ("positives = torch.nonzero(", "ahead = torch.nonzero(")),
])
def test_host_data_and_optimizer_state_made_at_any_step_read_no_sync(script, lines):
    # The three false classes seen on real scripts: a second optimizer's state made after the first step, host
    # data from NumPy (and its stack), and batches fetched before the scanned steps began.
    path = EXAMPLES / script
    report = run_doctor(path, (), QUICK)
    assert report.steps.scanned == 5 and report.failure is None
    assert [f for f in report.findings if f.kind == "sync"] == []
    assert [c for c in report.copies if c.direction == "device to host"] == []
    for text in lines:
        line_of(path, text)  # the labelled lines are there to read


def test_without_the_step_before_the_scan_a_batch_fetched_ahead_reads_one_false_count(monkeypatch):
    # The step before the scan records provenance: without it, the NumPy windows the last timed step fetched are
    # unknown to the first scanned step, and their nonzero reads once in the scanned window.
    from pitfalls.doctor import phases

    monkeypatch.setattr(phases, "BEFORE_SCAN_STEPS", 0)
    path = EXAMPLES / "batch_ahead.py"
    report = run_doctor(path, (), QUICK)
    found = report.finding_at("sync", str(path), line_of(path, "ahead = torch.nonzero("))
    assert [f.per_step for f in found] == [0.2]


def _gate(tmp_path, capsys, *argv: str) -> tuple[int, dict]:
    code = cli.main(["doctor", "--warmup", "1", "--steps", "1", "--scanned", "2", "--json", *argv])
    return code, json.loads(capsys.readouterr().out)


def test_a_baseline_gate_fails_on_one_more_item_and_passes_an_edit_above_the_step(tmp_path, capsys):
    source = (EXAMPLES / "gated.py").read_text()
    saved = tmp_path / "baseline.json"
    code, data = _gate(tmp_path, capsys, "--save-baseline", str(saved), str(EXAMPLES / "gated.py"))
    assert code == 0 and "baseline" not in data
    rows = json.loads(saved.read_text())["entries"]
    assert [(r["kind"], r["what"], r["file"], r["function"], r["per_step"]) for r in rows] == [
        ("rule", "float32 matmul without TF32", "<script>", "main", 2.0),  # the Linear forward, its weight's grad
        ("sync", ".item()", "<script>", "main", 1.0)]

    unchanged = tmp_path / "unchanged.py"
    unchanged.write_text(source)
    code, data = _gate(tmp_path, capsys, "--baseline", str(saved), str(unchanged))
    assert code == 0 and data["baseline"]["failed"] is False and data["baseline"]["added"] == []

    shifted = tmp_path / "shifted.py"  # a blank line above the step: every line number moves, no line is new
    shifted.write_text(source.replace("    while True:\n", "\n    while True:\n"))
    code, data = _gate(tmp_path, capsys, "--baseline", str(saved), str(shifted))
    assert code == 0 and data["baseline"]["added"] == data["baseline"]["grew"] == []

    extra = "        running += float(loss.detach().sum().item())  # one more\n"
    more = tmp_path / "more.py"
    more.write_text(source.replace("        running += loss.item()  # the step's one sync\n",
                                   "        running += loss.item()  # the step's one sync\n" + extra))
    code, data = _gate(tmp_path, capsys, "--baseline", str(saved), str(more))
    assert code == 1 and data["baseline"]["failed"] is True
    (added,) = data["baseline"]["added"]
    assert (added["what"], added["line"], added["code"]) == (".item()", line_of(more, "# one more"), extra.strip())

    removed = tmp_path / "removed.py"
    removed.write_text(source.replace("        running += loss.item()  # the step's one sync\n", ""))
    assert cli.main(["doctor", "--warmup", "1", "--steps", "1", "--scanned", "2", "--baseline", str(saved),
                     str(removed)]) == 0
    out = capsys.readouterr().out
    assert "the gate passes" in out and "removed: sync .item() at <script> in main: running += loss.item()" in out


@pytest.mark.parametrize(("argv", "message"), [
    (["--baseline", "absent.json"], "--baseline 'absent.json' cannot be read"),
    (["--baseline", "broken.json"], "--baseline 'broken.json' is not a baseline"),
    (["--save-baseline", "no/such/folder/b.json"], "its folder 'no/such/folder' does not exist"),
])
def test_a_bad_baseline_file_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "broken.json").write_text("{\"entries\": 3}")
    assert cli.main(["doctor", *argv, str(EXAMPLES / "gated.py")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("pitfalls doctor: ") and message in line


def test_a_batch_its_loader_pins_is_pinned_memory_though_this_machine_pins_nothing():
    path = EXAMPLES / "pinned_batches.py"
    report = run_doctor(path, (), QUICK)
    line = line_of(path, "x = x.to(device, non_blocking=True)")
    (row,) = [c for c in report.copies if c.line == line]
    assert (row.pinned, row.blocking, row.direction) == (True, False, "host to device")
    assert not any("pageable" in f.title or f.kind == "sync" for f in report.findings)


def test_an_item_under_inference_mode_is_named_item():
    path = EXAMPLES / "inference_item.py"
    report = run_doctor(path, (), QUICK)
    found = report.finding_at("sync", str(path), line_of(path, "# the evaluation's sync"))
    assert [(f.title, f.per_step) for f in found] == [(".item()", 1.0)]


SHORT = DoctorOptions(warmup=1, steps=3, scanned=2, memory=5)


def test_a_short_script_is_scanned_before_its_memory_steps_and_the_steps_it_lacked_are_named(capsys):
    path = EXAMPLES / "short.py"
    report = run_doctor(path, ["--steps", "10"], SHORT)
    s = report.steps
    assert (s.warmup, s.measured, s.before_scan, s.scanned, s.memory, s.total) == (1, 3, 1, 2, 3, 10)
    (item,) = report.finding_at("sync", str(path), line_of(path, "print(loss.item())"))
    assert item.per_step == 1.0
    assert report.memory is not None and report.memory.detail.startswith("over 3 steps after the scanned ones")
    assert ("the memory steps (the process group's memory): 3 of 5 (steps 8 to 12): the script ran 10 step(s)"
            in report.not_measured)


def test_a_script_that_ends_before_the_scan_says_so_and_never_reads_no_finding(capsys):
    path = EXAMPLES / "short.py"
    report = run_doctor(path, ["--steps", "5"], SHORT)
    assert report.steps.scanned == 0 and report.findings == () and report.ended == "the script ended after 5 steps"
    assert ("the scanned steps (sync hazards and copies by line, the rules): not run: they needed steps 6 to 7, and "
            "the script ran 5 step(s)") in report.not_measured
    assert any(line.startswith("the memory steps") and "not run" in line for line in report.not_measured)
    console = Console(record=True, width=200)
    render(report, console)
    text = console.export_text()
    assert "no finding, but the scanned steps never ran" in text and "no finding: nothing" not in text

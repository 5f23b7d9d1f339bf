"""scripts/run-suite for real, in a throw-away copy of the checkout: machine facts on an empty HOME, the series a
run joins, concurrent runs, signals, killed runs, dirty trees and bad set-ups. Every failure leaves results/ as
it was, byte for byte."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from asv.results import Results
from sandbox import (
    alive,
    bootstrapped,  # noqa: F401 (an autouse fixture)
    git,
    make_sandbox,
    marked,
    run_script,
    start_script,
    tree_digest,
)

pytestmark = pytest.mark.slow


# One parameter set each (asv's -b matches "name(param, ...)"), so a run takes seconds of asv, not minutes.
SAMPLER_ONE = r"bench_sampler\.SyncHazards\.track_sync_hazards\('static', 1000, 1, 'cpu'\)"
LOSS_ONE = r"bench_loss\.SyncHazards\.track_sync_hazards\('ignore_index', 4, 64, 'cpu'\)"
SAMPLER_OTHER = r"bench_sampler\.SyncHazards\.track_sync_hazards\('nonzero', 1000, 1, 'cpu'\)"
ASV_FIELDS = ("arch", "cpu", "num_cpu", "os", "ram")


@pytest.fixture()
def repo(tmp_path_factory) -> Path:
    """A sandbox of its own for each test: results one test adds are never read by another, in any order."""
    return make_sandbox(tmp_path_factory.mktemp("sandbox"))


@pytest.fixture()
def home(tmp_path) -> Path:
    """An empty HOME: no ~/.asv-machine.json, as on a fresh machine."""
    folder = tmp_path / "home"
    folder.mkdir()
    return folder


def new_results(repo: Path) -> list[Path]:
    """Results files the runs added to the sandbox (untracked under results/)."""
    status = git(repo, "status", "--porcelain", "--untracked-files=all", "results")
    added = [repo / line[3:] for line in status.splitlines() if line.startswith("?? ") and line.endswith(".json")]
    return sorted(path for path in added if path.name not in ("machine.json", "benchmarks.json"))


def measured(results: Results, key: str) -> list[float]:
    """The values a run recorded for ``key`` (asv stores n/a for the parameter sets it did not run)."""
    values = results.get_result_value(key, results.get_result_params(key))
    return [value for value in values if value is not None and value == value]


def one_line_error(done: subprocess.CompletedProcess) -> str:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert lines[-1].startswith("error: ")
    return lines[-1]


# --- refused before anything is measured ---------------------------------------------------------------------


def test_a_broken_configuration_is_named_before_the_check_runs(repo, home):
    before = tree_digest(repo / "results")
    conf = repo / "asv.conf.json"
    text = conf.read_text()
    conf.write_text(text[: len(text) // 2])
    try:
        done = run_script(repo, "run-suite", home=home, timeout=300)
    finally:
        conf.write_text(text)
    line = one_line_error(done)
    assert f"{conf}: not a valid asv configuration" in line
    assert "equivalence" not in done.stderr  # pitfalls check never started
    assert tree_digest(repo / "results") == before


def test_a_grid_or_rounds_not_allowed_is_named_before_anything_runs(repo, home):
    before = tree_digest(repo / "results")
    for variable, value, allowed in (("PITFALLS_GRID", "bogus", "allowed: quick, full"),
                                     ("PITFALLS_ROUNDS", "0", "allowed: an integer >= 1")):
        done = run_script(repo, "run-suite", "-b", SAMPLER_ONE, home=home, timeout=300, **{variable: value})
        line = one_line_error(done)
        assert f"{variable}={value!r}" in line and allowed in line and "nothing was measured" in line, line
        assert "equivalence" not in done.stderr
    # The regression gate reads the same two variables before its asv run.
    done = run_script(repo, "compare", "HEAD", home=home, timeout=300, PITFALLS_GRID="huge")
    assert "PITFALLS_GRID='huge' is not a grid; allowed: quick, full" in one_line_error(done)
    assert not (repo / ".asv" / "compare").exists()
    assert tree_digest(repo / "results") == before


@contextlib.contextmanager
def read_only(folder: Path) -> Iterator[None]:
    """Make ``folder`` read-only for real: a read-only bind mount as root (root ignores file modes), else chmod."""
    if os.geteuid() == 0:
        subprocess.run(["mount", "--bind", str(folder), str(folder)], check=True)
        try:
            subprocess.run(["mount", "-o", "remount,ro,bind", str(folder)], check=True)
            yield
        finally:
            subprocess.run(["umount", str(folder)], check=True)
    else:
        mode = folder.stat().st_mode
        folder.chmod(0o555)
        try:
            yield
        finally:
            folder.chmod(mode)


def test_a_read_only_results_folder_is_found_before_anything_is_measured(repo, home):
    before = tree_digest(repo / "results")
    try:
        with read_only(repo / "results"):
            done = run_script(repo, "run-suite", "-b", SAMPLER_ONE, home=home, timeout=300)
    except subprocess.CalledProcessError as error:
        pytest.skip(f"cannot make a read-only folder here: {error}")
    line = one_line_error(done)
    assert f"{repo / 'results'} is not writable" in line and "nothing was measured" in line
    assert "equivalence" not in done.stderr
    assert tree_digest(repo / "results") == before


def test_a_dirty_working_tree_is_refused_naming_the_changed_files(repo, home):
    before = tree_digest(repo / "results")
    readme = repo / "README.md"
    text = readme.read_text()
    readme.write_text(text + "\nan uncommitted line\n")
    (repo / "benchmarks" / "scratch.py").write_text("# new\n")
    try:
        done = run_script(repo, "run-suite", "-b", SAMPLER_ONE, home=home, timeout=300)
    finally:
        readme.write_text(text)
        (repo / "benchmarks" / "scratch.py").unlink()
    line = one_line_error(done)
    assert "the working tree differs from HEAD (README.md, benchmarks/scratch.py)" in line
    assert "--allow-dirty" in line
    assert tree_digest(repo / "results") == before


# --- a real run ------------------------------------------------------------------------------------------------


def test_a_fresh_home_keeps_every_machine_fact_and_joins_the_torch_series(repo, home):
    machine_json = {p: p.read_text() for p in (repo / "results").glob("*/machine.json")}
    done = run_script(repo, "run-suite", "-b", SAMPLER_ONE, "--no-publish", home=home)
    assert done.returncode == 0, done.stderr[-5000:]
    # The gate proved the family it measures (src/pitfalls/runner/gate.py).
    assert "== equivalence: every variant against naive (of the families -b selects: sampler)" in done.stderr
    # No committed machine.json is rewritten, let alone with fewer facts.
    assert {p: p.read_text() for p in machine_json} == machine_json
    # Nor any committed result (benchmarks.json describes the suite as it is now, so it follows the code).
    assert git(repo, "diff", "--stat", "results", ":(exclude)results/benchmarks.json") == ""
    [added] = new_results(repo)
    head = git(repo, "rev-parse", "HEAD").strip()
    results = Results.load(str(added))
    import torch

    torch_version = torch.__version__.split("+")[0]
    assert added.name == f"{head[:8]}-installed-py3.11-torch{torch_version}.json"
    machine = results.params["machine"]
    recorded = json.loads((repo / "results" / machine / "machine.json").read_text())
    for key in ASV_FIELDS:
        assert results.params[key] == recorded[key], key
    assert results.params["python"] == "3.11" and results.params["torch"] == torch_version
    # Same params as the virtualenv runs of that torch on this machine: asv draws them as one series.
    virtualenv = sorted((repo / "results" / machine).glob(f"*-virtualenv-py3.11-torch{torch_version}.json"))
    if virtualenv:
        assert Results.load(str(virtualenv[-1])).params == results.params
    assert measured(results, "bench_sampler.SyncHazards.track_sync_hazards") == [0]  # static, 1000, 1, cpu
    assert not any((repo / ".asv" / "staging").iterdir())


def test_two_runs_at_once_both_land(repo, home):
    loss = start_script(repo, "run-suite", "-b", LOSS_ONE, "--no-publish", home=home)
    sampler = start_script(repo, "run-suite", "-b", SAMPLER_OTHER, "--no-publish", home=home)
    outs = [process.communicate(timeout=900) for process in (loss, sampler)]
    # asv's own messages go to stdout, the job's to stderr: a failure shows both.
    assert loss.returncode == 0, outs[0][0][-3000:] + outs[0][1][-3000:]
    assert sampler.returncode == 0, outs[1][0][-3000:] + outs[1][1][-3000:]
    [added] = new_results(repo)
    results = Results.load(str(added))
    assert measured(results, "bench_loss.SyncHazards.track_sync_hazards") == [0]  # ignore_index
    assert 2 in measured(results, "bench_sampler.SyncHazards.track_sync_hazards")  # nonzero, one row


def wait_for_forkserver(process: subprocess.Popen, marker: str, timeout: float = 600) -> list[psutil.Process]:
    """Wait until asv's forkserver of the run is up; returns every process of the run then."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()[1][-3000:]
        found = marked(marker)
        if any("run_server" in " ".join(p.cmdline()) for p in alive(found)):
            return found
        time.sleep(0.5)
    raise AssertionError("asv's forkserver did not start")


def test_sigterm_to_the_script_stops_asv_and_its_forkserver_and_removes_staging(repo, home):
    before = tree_digest(repo / "results")
    process = start_script(repo, "run-suite", "-b", "bench_sampler.SyncHazards", "--no-publish", home=home)
    marker = str(repo / ".asv" / "staging" / f"run-{process.pid}")
    try:
        running = wait_for_forkserver(process, marker)
        groups = {os.getpgid(p.pid) for p in alive(running)}
        assert len(groups) >= 2, "asv and its forkserver run in process groups of their own"
        os.kill(process.pid, signal.SIGTERM)  # the script's PID alone, as `kill PID` does
        _, err = process.communicate(timeout=60)
        deadline = time.monotonic() + 20
        while (alive(running) or marked(marker)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not alive(running) and not marked(marker), "a process of the run outlived it"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 128 + signal.SIGTERM
    assert "interrupted by SIGTERM" in err and "results/ is unchanged" in err
    assert not Path(marker).exists()  # staging, and asv's forkserver folders in its tmp/, are gone
    assert tree_digest(repo / "results") == before


def test_a_killed_run_is_cleaned_up_by_the_next_and_dirty_runs_get_their_own_machine(repo, home):
    killed = start_script(repo, "run-suite", "-b", "SyncHazards", "--no-publish", home=home)
    marker = str(repo / ".asv" / "staging" / f"run-{killed.pid}")
    leftover = None
    try:
        wait_for_forkserver(killed, marker)
        os.kill(killed.pid, signal.SIGKILL)  # nothing can clean up after SIGKILL
        killed.wait(timeout=60)  # not communicate(): asv holds the pipes open while it runs on
        # asv writes into the killed job's pipe and ends at its next line (in 2 of 3 test commands before the next
        # run came); a process of the run that outlives it, as a benchmark's own child can, is planted here.
        leftover = subprocess.Popen(["sleep", "600"], env={**os.environ, "PITFALLS_RUN": marker},
                                    start_new_session=True)
        assert marked(marker) and Path(marker).exists()
        clean = {p: p.read_bytes() for p in (repo / "results").rglob("*") if p.is_file()}

        (repo / "NOTES.txt").write_text("uncommitted\n")
        done = run_script(repo, "run-suite", "--allow-dirty", "-b", SAMPLER_ONE, "--no-publish", home=home)
        ended = leftover.poll() is not None  # before the clean-up below kills what is left
    finally:
        (repo / "NOTES.txt").unlink(missing_ok=True)
        for process in marked(marker):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(os.getpgid(process.pid), signal.SIGKILL)
        killed.stdout.close()
        killed.stderr.close()
        if leftover is not None:
            leftover.kill()
            leftover.wait()
    assert done.returncode == 0, done.stderr[-5000:]
    assert f"removing {marker}: the staging folder of an earlier run that was killed" in done.stderr
    assert "stopped" in done.stderr and not marked(marker) and not Path(marker).exists()
    assert ended, "the next run left the killed run's process running"
    # The dirty run lands under <machine>-dirty and leaves every clean file as it was.
    assert "uncommitted changes (NOTES.txt)" in done.stderr
    assert {p: p.read_bytes() for p in clean} == clean
    dirty = [p for p in new_results(repo) if p.parent.name.endswith("-dirty")]
    assert len(dirty) == 1
    facts = json.loads((dirty[0].parent / "machine.json").read_text())
    assert facts["machine"] == dirty[0].parent.name and all(facts[key] for key in ASV_FIELDS)

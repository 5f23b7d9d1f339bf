"""pitfalls.runner: the staged configuration, the machine record, the installed environment, merging, the gate."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from asv import util
from asv.config import Config
from asv.environment import get_environments
from asv.plugin_manager import plugin_manager
from asv.results import Results
from asv_results import FACTS, add, benchmark, results, write_machine, write_suite

import pitfalls_asv
from pitfalls.asv_files import read_json, result_files
from pitfalls.runner import compare, machine, processes, store
from pitfalls.runner.conf import RunnerError, load_conf, project_paths, write_staged_conf
from pitfalls.runner.merge import merge_folders
from pitfalls.runner.relabel import relabel
from pitfalls.runner.worktree import changed_files, commit_of, describe_changes

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "asv.conf.json"
# The committed results' machine, read at HEAD (`committed_inputs`): a user's own run may add to its folder.
COMMITTED = Path("results") / "cpu-amd-epyc-2cpu"
ASV_FIELDS = ("arch", "cpu", "num_cpu", "os", "ram")


def tree_digest(folder: Path) -> dict[str, str]:
    """sha256 of every file under ``folder``."""
    import hashlib

    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


# --- asv.conf.json --------------------------------------------------------------------------------------------


def test_a_broken_configuration_is_named_in_one_line(tmp_path):
    broken = tmp_path / "asv.conf.json"
    broken.write_text(CONF.read_text(encoding="utf-8")[:-40], encoding="utf-8")
    with pytest.raises(RunnerError) as error:
        load_conf(broken)
    message = str(error.value)
    assert message.startswith(f"{broken}: not a valid asv configuration: ")
    assert "\n" not in message
    with pytest.raises(RunnerError, match="no such file"):
        load_conf(tmp_path / "missing.json")
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(RunnerError, match="expected a JSON object"):
        load_conf(tmp_path / "list.json")


def test_the_staged_copy_has_absolute_paths_and_its_own_results(tmp_path):
    staged = write_staged_conf(CONF, tmp_path / "stage", results_dir=tmp_path / "out")
    conf = json.loads(staged.read_text())
    original = load_conf(CONF)
    assert conf["results_dir"] == str((tmp_path / "out").resolve())
    assert conf["repo"] == str(ROOT) and conf["benchmark_dir"] == str(ROOT / "benchmarks")
    assert conf["html_dir"] == str(ROOT / "html") and conf["env_dir"] == str(ROOT / ".asv" / "env")
    for key in ("matrix", "plugins", "exclude", "launch_method", "build_command"):
        assert conf[key] == original[key]
    # asv itself reads the copy from anywhere to the same project.
    assert Config.load(str(staged)).benchmark_dir == str(ROOT / "benchmarks")
    assert project_paths(staged)["results_dir"] == (tmp_path / "out").resolve()


# --- the machine ----------------------------------------------------------------------------------------------


def test_machine_names_say_what_measured():
    cpu = {"cpu_model": "AMD EPYC 7R13 Processor", "cpu_usable": 2, "gpus": "unavailable: no CUDA device"}
    assert machine.machine_name(cpu) == "cpu-amd-epyc-7r13-processor-2cpu"
    intel = {"cpu_model": "Intel(R) Xeon(R) Platinum 8375C", "cpu_usable": 8, "gpus": []}
    assert machine.machine_name(intel) == "cpu-intel-xeon-platinum-8375c-8cpu"
    gpu = {**cpu, "gpus": [{"name": "NVIDIA H200"}], "driver": "570.86", "cuda": "13.0"}
    assert machine.machine_name(gpu) == "gpu-nvidia-h200"
    facts = machine.machine_facts("gpu-nvidia-h200", gpu)
    assert {facts["gpu"], facts["gpu_driver"], facts["cuda"]} == {"NVIDIA H200", "570.86", "13.0"}
    assert set(ASV_FIELDS) <= set(facts)
    assert not set(machine.GPU_FACTS) & set(machine.machine_facts("cpu-x", cpu))


def test_a_run_in_a_container_records_its_image_as_a_machine_fact(monkeypatch):
    cpu = {"cpu_model": "AMD EPYC", "cpu_usable": 2, "gpus": "unavailable: no CUDA device"}
    monkeypatch.delenv(machine.IMAGE_ENV, raising=False)
    assert "image" not in machine.machine_facts("cpu-x", cpu)  # outside a container: the params stay as they were
    monkeypatch.setenv(machine.IMAGE_ENV, "pytorch/pytorch:2.14.1-cuda13.0-cudnn9-runtime")
    assert machine.machine_facts("cpu-x", cpu)["image"] == "pytorch/pytorch:2.14.1-cuda13.0-cudnn9-runtime"


def run_machine_step(results: Path, home: Path, **env: str) -> dict[str, str]:
    done = subprocess.run(
        [sys.executable, "-m", "pitfalls.runner", "machine", "--results", str(results)],
        env={**os.environ, "HOME": str(home), **env}, capture_output=True, text=True, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_machine_step_with_an_empty_home_records_every_fact(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    facts = run_machine_step(tmp_path / "no-results", home, PITFALLS_MACHINE="fresh-box")
    assert facts["machine"] == "fresh-box"
    for key in ASV_FIELDS:
        assert facts[key], key
    assert int(facts["num_cpu"]) >= 1 and int(facts["ram"]) > 2**20
    # What asv run will read: the full record, not just the name (`asv machine --yes --machine` saves the name).
    saved = util.load_json(str(home / ".asv-machine.json"), api_version=1)
    assert saved["fresh-box"] == facts


def test_machine_step_keeps_the_recorded_facts_and_says_which(tmp_path):
    results = tmp_path / "results"
    write_machine(results, "box", {**FACTS, "os": "Linux an-older-kernel"})
    home = tmp_path / "home"
    home.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "pitfalls.runner", "machine", "--results", str(results)],
        env={**os.environ, "HOME": str(home), "PITFALLS_MACHINE": "box"}, capture_output=True, text=True,
        timeout=300, check=False,
    )
    facts = json.loads(done.stdout)
    assert facts == {**FACTS, "os": "Linux an-older-kernel", "machine": "box"}
    assert "keeping the recorded os 'Linux an-older-kernel'" in done.stderr


def test_the_committed_machine_keeps_all_its_facts_on_a_fresh_home(tmp_path, committed_inputs):
    committed = util.load_json(str(committed_inputs / COMMITTED / "machine.json"), api_version=1)
    home = tmp_path / "home"
    home.mkdir()
    facts = run_machine_step(committed_inputs / "results", home, PITFALLS_MACHINE=committed["machine"])
    assert facts == committed


def test_a_users_own_machine_entry_only_fills_what_is_neither_recorded_nor_measured(tmp_path):
    path = tmp_path / "asv-machine.json"
    util.write_json(str(path), {"box": {"machine": "box", "cpu": "my own words", "rack": "r12"}}, api_version=1)
    hardware = {"cpu_model": "x", "cpu_usable": 1, "gpus": "unavailable: none"}
    measured = machine.machine_facts("box", hardware)
    record = machine.record_machine("box", tmp_path / "results", hardware, machine_file=path)
    assert record.facts == {**measured, "rack": "r12"} and record.kept == ()
    # What was written is what asv run reads; a second run on that HOME still measures anew.
    assert util.load_json(str(path), api_version=1)["box"] == record.facts
    write_machine(tmp_path / "results", "box", {**FACTS, "cpu": "recorded"})
    again = machine.record_machine("box", tmp_path / "results", hardware, machine_file=path)
    assert again.facts["cpu"] == "recorded" and ("cpu", "recorded", measured["cpu"]) in again.kept


# --- the installed environment ---------------------------------------------------------------------------------


def environments(spec: str) -> list:
    conf = Config.load(str(CONF))
    for plugin in conf.plugins:
        plugin_manager.import_plugin(plugin)
    return list(get_environments(conf, [spec], verbose=False))


def test_the_installed_environment_is_named_by_python_and_torch_not_by_path(tmp_path):
    import torch

    [env] = environments("installed:same")
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    public = torch.__version__.split("+")[0]
    assert env.name == f"installed-py{version}-torch{public}"
    assert env.python == version and env.requirements == {"torch": public}
    # The same environment seen from another path (another checkout's venv) gives the same label.
    venv = Path(sys.prefix)
    other_venv = tmp_path / "elsewhere" / ".venv"
    (other_venv / "bin").mkdir(parents=True)
    (other_venv / "pyvenv.cfg").write_text((venv / "pyvenv.cfg").read_text())
    (other_venv / "lib").symlink_to(venv / "lib")
    link = other_venv / "bin" / "python"
    link.symlink_to(Path(sys.executable).resolve())
    [other] = environments(f"installed:{link}")
    assert other.name == env.name and str(tmp_path) not in other.name


def test_the_installed_environment_has_the_params_of_the_virtualenv_of_its_torch():
    [installed] = environments("installed:same")
    torch = installed.requirements["torch"]
    matrix = {str(env.requirements.get("torch")): env for env in get_environments(Config.load(str(CONF)), None,
                                                                                     verbose=False)}
    if torch not in matrix:
        pytest.skip(f"torch {torch} is not in asv.conf.json's matrix ({', '.join(matrix)})")
    virtualenv = matrix[torch]
    # asv's run puts {python: env.python, **env.requirements} into every result's params: equal params, one series.
    assert (installed.python, installed.requirements) == (virtualenv.python, virtualenv.requirements)


def test_public_version_drops_the_local_build_label():
    assert pitfalls_asv.public_version("2.13.0+cpu") == "2.13.0"
    assert pitfalls_asv.public_version("2.11.0+cu130") == "2.11.0"
    assert pitfalls_asv.public_version("2.14.1") == "2.14.1"


# --- merging results -------------------------------------------------------------------------------------------

HAZARDS = benchmark("bench_loss.SyncHazards.track_sync_hazards", [["'naive'", "'ignore_index'"]])
SAMPLER = benchmark("bench_sampler.SyncHazards.track_sync_hazards", [["'nonzero'", "'static'"]])
STEP = benchmark("bench_loss.Step.time_step", [["'naive'"]])


def staged_folder(folder: Path, *entries: tuple[dict, list[float]], minute: int = 0, machine_name: str = "box",
                  commit: str = "a" * 40) -> Path:
    write_suite(folder, [HAZARDS, SAMPLER, STEP])
    write_machine(folder, machine_name)
    res = results(machine_name, commit)
    for bench, values in entries:
        add(res, bench, values, minute=minute)
    res.save(str(folder))
    return folder


def test_two_runs_of_different_subsets_both_land(tmp_path):
    target = tmp_path / "results"
    first = staged_folder(tmp_path / "one", (HAZARDS, [5, 0]), minute=1)
    second = staged_folder(tmp_path / "two", (SAMPLER, [2, 0]), minute=2)
    with store.locked(target):
        store.merge_into(first, target, before={})
        store.merge_into(second, target, before={})
    [relative] = result_files(target)
    merged = Results.load(str(target / relative))
    assert merged.get_result_value(HAZARDS["name"], HAZARDS["params"]) == [5, 0]
    assert merged.get_result_value(SAMPLER["name"], SAMPLER["params"]) == [2, 0]
    assert merged.params["torch"] == "2.13.0" and merged.params["cpu"] == FACTS["cpu"]


def test_only_what_a_run_measured_is_taken_from_its_staged_copy(tmp_path):
    target = staged_folder(tmp_path / "results", (HAZARDS, [5, 0]), (SAMPLER, [2, 0]), minute=1)
    # A run staged a copy, measured the loss again; meanwhile another run changed the sampler's figures.
    staged = tmp_path / "stage"
    import shutil

    shutil.copytree(target, staged)
    before = store.snapshot(staged)
    [relative] = result_files(staged)
    res = Results.load(str(staged / relative))
    add(res, HAZARDS, [4, 0], minute=5)
    res.save(str(staged))
    other = Results.load(str(target / relative))
    add(other, SAMPLER, [3, 1], minute=4)
    other.save(str(target))
    with store.locked(target):
        assert store.merge_into(staged, target, before=before) == [relative]
    merged = Results.load(str(target / relative))
    assert merged.get_result_value(HAZARDS["name"], HAZARDS["params"]) == [4, 0]
    assert merged.get_result_value(SAMPLER["name"], SAMPLER["params"]) == [3, 1]  # not the stale copy's [2, 0]
    # A staged copy that measured nothing writes nothing.
    assert store.merge_into(staged, target, before=store.snapshot(staged)) == []


def test_a_merge_never_thins_machine_facts(tmp_path):
    target = staged_folder(tmp_path / "results", (HAZARDS, [5, 0]))
    source = staged_folder(tmp_path / "source", (SAMPLER, [2, 0]))
    util.write_json(str(source / "box" / "machine.json"), {"machine": "box", "gpu": "X"}, api_version=1)
    store.merge_into(source, target, suite="union")
    facts = read_json(target / "box" / "machine.json", 1)
    assert facts == {**FACTS, "machine": "box", "gpu": "X"}


def test_an_unreadable_file_stops_the_merge_before_anything_changes(tmp_path):
    target = staged_folder(tmp_path / "results", (HAZARDS, [5, 0]), commit="b" * 40)
    source = staged_folder(tmp_path / "source", (SAMPLER, [2, 0]), commit="b" * 40)
    staged_folder(source, (STEP, [0.5]), commit="c" * 40)
    broken = target / result_files(target)[0]
    broken.write_text(broken.read_text()[:50])
    digest = tree_digest(target)
    with pytest.raises(RunnerError, match=str(broken)):
        store.merge_into(source, target, suite="union")
    assert tree_digest(target) == digest


def test_a_damaged_file_the_run_left_alone_does_not_stop_its_merge(tmp_path):
    import shutil

    target = staged_folder(tmp_path / "results", (HAZARDS, [5, 0]), commit="b" * 40)
    staged_folder(target, (STEP, [0.5]), commit="c" * 40)
    damaged = target / "box" / "cccccccc-installed-py3.11-torch2.13.0.json"
    damaged.write_text(damaged.read_text()[:50])
    staged = tmp_path / "stage"
    shutil.copytree(target, staged)
    before = store.snapshot(staged)
    res = Results.load(str(staged / "box" / "bbbbbbbb-installed-py3.11-torch2.13.0.json"))
    add(res, SAMPLER, [2, 0], minute=9)
    res.save(str(staged))
    damaged_bytes = damaged.read_bytes()
    assert store.merge_into(staged, target, before=before) == ["box/bbbbbbbb-installed-py3.11-torch2.13.0.json"]
    assert damaged.read_bytes() == damaged_bytes


def test_check_writable_names_the_folder(tmp_path):
    store.check_writable(tmp_path / "not" / "yet")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(RunnerError, match="not a folder"):
        store.check_writable(blocker / "results")


def test_suites_that_differ_are_refused_with_the_benchmark_named(tmp_path):
    one = staged_folder(tmp_path / "one", (HAZARDS, [5, 0]))
    two = staged_folder(tmp_path / "two", (SAMPLER, [2, 0]), machine_name="other")
    write_suite(two, [benchmark(HAZARDS["name"], HAZARDS["params"], version="v2"), SAMPLER, STEP])
    out = tmp_path / "merged"
    with pytest.raises(RunnerError) as error:
        merge_folders([one, two], out)
    message = str(error.value)
    assert "describe different suites: 1 benchmark(s) differ" in message
    assert HAZARDS["name"] in message and "version 'v1' vs 'v2'" in message and "\n" not in message
    assert not out.exists()
    with pytest.raises(RunnerError, match="not an asv results folder"):
        merge_folders([tmp_path], out)


@pytest.mark.cuda_build
def test_merge_command_refuses_a_conflict_in_one_line_with_exit_2(tmp_path):
    one = staged_folder(tmp_path / "one", (HAZARDS, [5, 0]))
    two = staged_folder(tmp_path / "two", (SAMPLER, [2, 0]), machine_name="other")
    write_suite(two, [benchmark(STEP["name"], [["'where'"]]), HAZARDS, SAMPLER])
    done = subprocess.run([sys.executable, "-m", "pitfalls.cli", "merge", str(one), str(two), "--out",
                           str(tmp_path / "out"), "--config", str(CONF)], capture_output=True, text=True, check=False)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith("pitfalls merge: ") and "params" in done.stderr


# --- relabelling old main-job results ----------------------------------------------------------------------------


def test_relabel_gives_an_existing_environment_file_the_installed_label(tmp_path):
    res = Results({**FACTS, "machine": "box", "python": "/some/checkout/.venv/bin/python3"}, {}, "d" * 40,
                  1_700_000_000_000, "/some/checkout/.venv/bin/python3", "existing-py_some_checkout_.venv_bin_python3",
                  {})
    add(res, HAZARDS, [5, 0])
    res.save(str(tmp_path))
    old = tmp_path / "box" / "dddddddd-existing-py_some_checkout_.venv_bin_python3.json"
    new = relabel(old, python="3.11", torch="2.13.0")
    assert new == tmp_path / "box" / "dddddddd-installed-py3.11-torch2.13.0.json" and not old.exists()
    loaded = Results.load(str(new))
    assert loaded.params == {**FACTS, "machine": "box", "python": "3.11", "torch": "2.13.0"}
    assert loaded.get_result_value(HAZARDS["name"], HAZARDS["params"]) == [5, 0]
    with pytest.raises(RunnerError, match="not asv's `existing` one"):
        relabel(new, python="3.11", torch="2.13.0")


def test_no_committed_results_file_is_named_after_a_path(committed_inputs):
    for path in (committed_inputs / "results").rglob("*.json"):
        assert "existing-py_" not in path.name, path
    for path in (committed_inputs / COMMITTED).glob("*-*.json"):
        params = json.loads(path.read_text())["params"]
        assert params["python"] == "3.11" and params["torch"] in ("2.13.0", "2.14.1"), path


# --- the gate ---------------------------------------------------------------------------------------------------


def test_times_gate_on_a_gpu_machine_and_counts_everywhere():
    assert compare.gate_times_by_default({"gpu": "NVIDIA H200"}, {}) is True
    assert compare.gate_times_by_default({"cpu": "AMD EPYC"}, {}) is False
    assert compare.gate_times_by_default({"cpu": "AMD EPYC"}, {"PITFALLS_COMPARE_TIMES": "1"}) is True
    assert compare.gate_times_by_default({"gpu": "X"}, {"PITFALLS_COMPARE_TIMES": "0"}) is False
    with pytest.raises(RunnerError, match="PITFALLS_COMPARE_TIMES='yes' is not allowed"):
        compare.gate_times_by_default({}, {"PITFALLS_COMPARE_TIMES": "yes"})


def gate_results(tmp_path: Path, hazards_after: list[float], time_after: float) -> Path:
    folder = tmp_path / "results"
    write_suite(folder, [HAZARDS, STEP])
    write_machine(folder, "box")
    for commit, hazards, step in (("a" * 40, [5, 0], 0.010), ("b" * 40, hazards_after, time_after)):
        res = results("box", commit)
        add(res, HAZARDS, hazards)
        # Ten samples: asv's significance test cannot tell two sets of six apart at its threshold.
        add(res, STEP, [step], samples=[[step * (1 + i / 1000) for i in range(-5, 5)]])
        res.save(str(folder))
    return write_staged_conf(CONF, tmp_path, results_dir=folder)


def test_the_counts_gate_catches_a_new_hazard_and_ignores_a_slower_time(tmp_path):
    conf = gate_results(tmp_path / "hazard", [5, 1], 0.010)
    assert compare.counts_verdict(conf, "box", "installed-py3.11-torch2.13.0", "a" * 40, "b" * 40, 1.2)
    conf = gate_results(tmp_path / "slower", [5, 0], 0.300)
    assert not compare.counts_verdict(conf, "box", "installed-py3.11-torch2.13.0", "a" * 40, "b" * 40, 1.2)
    # The same 30x slower time fails asv's own comparison once times are gated.
    assert compare.counts_verdict(conf, "box", "installed-py3.11-torch2.13.0", "a" * 40, "b" * 40, 1.2,
                                  pattern=compare.TIMES)


# --- a run's processes -----------------------------------------------------------------------------------------


def test_a_runs_processes_in_other_groups_are_found_by_the_marker_and_stopped(tmp_path):
    # As asv's forkserver: a process of the run that leaves the group of the process the run started.
    code = ("import os, subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import os, time; "
            "os.setpgid(0, 0); print(os.getpid(), flush=True); time.sleep(120)']); time.sleep(120)")
    marker = str(tmp_path)
    child = processes.start([sys.executable, "-c", code], marker=marker, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    server = int(child.stdout.readline())
    assert os.getpgid(server) not in (os.getpgid(0), child.pid)
    assert {p.pid for p in processes.run_processes(marker)} == {child.pid, server}
    assert processes.run_processes(marker + "-another") == []
    assert processes.stop(marker, grace_s=1.0, extra=[child]) == sorted([child.pid, server])
    assert child.returncode == -signal.SIGTERM and processes.run_processes(marker) == []


# --- the working tree --------------------------------------------------------------------------------------------


def test_changed_files_lists_edits_and_new_files_but_not_results(tmp_path):
    repo = tmp_path / "repo"
    (repo / "src").mkdir(parents=True)
    (repo / "results").mkdir()
    (repo / "src" / "a.py").write_text("1")
    (repo / "results" / "r.json").write_text("{}")
    (repo / ".gitignore").write_text("/html/\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.invalid", "-c",
           "commit.gpgsign=false"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    ignore = [repo / "results", repo / "html"]
    assert changed_files(repo, ignore) == []
    (repo / "src" / "a.py").write_text("2")
    (repo / "src" / "new.py").write_text("3")
    (repo / "results" / "r.json").write_text("{1}")
    (repo / "html").mkdir()
    (repo / "html" / "index.html").write_text("x")
    assert sorted(changed_files(repo, ignore)) == ["src/a.py", "src/new.py"]
    assert describe_changes([f"f{i}" for i in range(7)]) == "f0, f1, f2, f3, f4 and 2 more"
    assert len(commit_of(repo)) == 40
    with pytest.raises(RunnerError, match="not a commit of .*'no-such-branch'"):
        commit_of(repo, "no-such-branch")

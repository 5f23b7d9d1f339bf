"""The fleet on a real scheduler: submit-fleet on a one-node Slurm cluster of Debian's packages, on loopback.

One controller and one node on this machine (tests/slurm_cluster.py), with two partitions and two node features
standing for two GPU kinds. submit-fleet submits one array task per kind, each running this checkout's own
scripts/run-suite (``PITFALLS_RUNTIME=checkout``) on one cheap benchmark in a clone of its own, and the merge after
them; then a fleet whose only task fails, whose merge Slurm must cancel. The whole run is one module fixture (the
cluster is stopped before any test reads what it saw), so no test depends on another.
"""

from __future__ import annotations

import ipaddress
import itertools
import json
import math
import os
import re
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
from sandbox import (
    ROOT,
    VENV,
    bootstrapped,  # noqa: F401 (an autouse fixture)
    git,
    make_sandbox,
    tree_digest,
)
from slurm_cluster import FINISHED, Cluster, listeners, local_cluster, processes, stopped, unavailable

UNAVAILABLE = unavailable()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(UNAVAILABLE is not None, reason=UNAVAILABLE or "")]

# One parameter set of the cheapest benchmark (a task proves the sampler family alone before it: runner/gate.py).
ONE = r"bench_sampler\.SyncHazards\.track_sync_hazards\('static', 1000, 1, 'cpu'\)"
BENCH = "bench_sampler.SyncHazards.track_sync_hazards"
# A GPU kind each, as a cluster names it: a node feature and a partition.
KINDS = ("constraint=kind-a", "partition=kind-b")
# The array script asks for a GPU, 8 CPUs, 64 GB and 12 hours; the test's node has 2 CPUs and no GPU.
SMALL_NODE = ("--gres=none", "--cpus-per-task=1", "--mem=1G", "--time=10")
MACHINES = ("fleet-task-0", "fleet-task-1")


@dataclass(frozen=True)
class Fleet:
    """What one submit-fleet call did: the ids it printed, Slurm's records of those jobs once finished, and the
    cluster's listening sockets while the tasks ran."""

    tasks: tuple[str, ...]
    merge: str
    records: Mapping[str, Mapping[str, str]]
    listening: list[tuple[str, int]]


@dataclass(frozen=True)
class Seen:
    """Everything the module's one run observed, read by the tests after the cluster is gone."""

    cluster: Cluster
    checkout: Path
    fleet_dir: Path
    head: str
    listening: list[tuple[str, int]]
    good: Fleet
    bad: Fleet
    completions: list[dict[str, str]]
    merged_before_bad: dict[str, str]
    merged_after_bad: dict[str, str]
    results_before: dict[str, dict[str, str]]
    results_after: dict[str, dict[str, str]]
    left: list[str]
    seconds: float


def submit(checkout: Path, env: dict[str, str], *kinds: str) -> tuple[list[str], str]:
    """submit-fleet from ``checkout``: (each task's job id, the merge's)."""
    done = subprocess.run(["bash", str(checkout / "deploy" / "slurm" / "submit-fleet"), *SMALL_NODE, *kinds, "--",
                           "-b", ONE], cwd=checkout, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    *tasks, merge = done.stdout.split()
    assert len(tasks) == len(kinds), done.stdout
    return tasks, merge


def run_fleet(cluster: Cluster, checkout: Path, env: dict[str, str], kinds: tuple[str, ...],
              timeout: float) -> Fleet:
    """Submit a fleet and wait for all of its jobs; each task is ``<array job>_<task>``."""
    tasks, merge = submit(checkout, env, *kinds)
    names = tuple(f"{job}_{index}" for index, job in enumerate(tasks))
    # Where the cluster listens while its tasks run (slurmstepd, the jobs), not only when it is idle.
    cluster.wait(list(names), timeout, until=("RUNNING", *FINISHED))
    listening = listeners(cluster.ports, {process.pid for process in processes(cluster)})
    return Fleet(tasks=names, merge=merge, records=cluster.wait([*names, merge], timeout), listening=listening)


def results_digests(checkout: Path) -> dict[str, dict[str, str]]:
    return {str(folder): tree_digest(folder) for folder in (checkout / "results", ROOT / "results")}


@pytest.fixture(scope="module")
def seen(tmp_path_factory) -> Seen:
    """A good fleet of two kinds, then a fleet whose task fails, on one cluster started and stopped here."""
    began = time.monotonic()
    root = tmp_path_factory.mktemp("slurm")
    checkout = make_sandbox(root / "checkout")
    fleet_dir, home, scratch = root / "fleet", root / "home", root / "scratch"
    home.mkdir()
    scratch.mkdir()
    results_before = results_digests(checkout)
    with local_cluster(root / "cluster") as cluster:
        listening = listeners(cluster.ports, {process.pid for process in processes(cluster)})
        env = {**cluster.env, "HOME": str(home), "TMPDIR": str(scratch), "PITFALLS_RUNTIME": "checkout",
               "PITFALLS_FLEET": str(fleet_dir), "PITFALLS_VENV": str(VENV), "PITFALLS_GRID": "quick",
               "PITFALLS_MACHINE": "fleet-task-%a"}
        good = run_fleet(cluster, checkout, env, KINDS, timeout=300)
        merged_before_bad = tree_digest(fleet_dir / "results") | tree_digest(fleet_dir / "html")
        # A merge left pending (no --kill-on-invalid-dep) would never finish: the wait fails instead.
        bad = run_fleet(cluster, checkout, {**env, "PITFALLS_GRID": "bogus"}, KINDS[:1], timeout=120)
        merged_after_bad = tree_digest(fleet_dir / "results") | tree_digest(fleet_dir / "html")
        # The job-completion log is written as each job ends; the merge's cancellation comes last.
        deadline = time.monotonic() + 10
        while len(cluster.completions()) < 5 and time.monotonic() < deadline:
            time.sleep(0.2)
        completions = cluster.completions()
    head = git(checkout, "rev-parse", "HEAD").strip()
    return Seen(cluster=cluster, checkout=checkout, fleet_dir=fleet_dir, head=head, listening=listening, good=good,
                bad=bad, completions=completions,
                merged_before_bad=merged_before_bad, merged_after_bad=merged_after_bad,
                results_before=results_before, results_after=results_digests(checkout), left=stopped(cluster),
                seconds=time.monotonic() - began)


def completion(seen: Seen, job_id: str) -> dict[str, str]:
    """Slurm's job-completion record of one job (written as the job ends)."""
    (entry,) = (entry for entry in seen.completions if entry["JobId"] == job_id)
    return entry


def log_of(seen: Seen, job: str) -> str:
    logs = {path.name: path for path in (seen.fleet_dir / "logs").iterdir()}
    array, _, task = job.partition("_")
    name = f"pitfalls-{array}_{task}.out" if task else f"pitfalls-merge-{job}.out"
    return logs[name].read_text(errors="replace")[-4000:] if name in logs else f"(no log {name})"


def test_the_daemons_listen_on_loopback_only(seen):
    for listening in (seen.listening, seen.good.listening, seen.bad.listening):
        assert {port for _, port in listening} >= set(seen.cluster.ports), listening
        # 127.0.0.1 here, where /etc/hosts maps the host name to it.
        assert {address for address, _ in listening} == {seen.cluster.address}, listening
        assert ipaddress.ip_address(seen.cluster.address).is_loopback


def test_each_kind_ran_as_an_array_task_then_the_merge_after_them(seen):
    records = seen.good.records
    for job in (*seen.good.tasks, seen.good.merge):
        assert records[job]["JobState"] == "COMPLETED" and records[job]["ExitCode"] == "0:0", log_of(seen, job)
    first, second = (records[job] for job in seen.good.tasks)
    # Each kind reached the scheduler as what it names: a feature, a partition.
    assert first["Features"] == "kind-a" and second["Partition"] == "kind-b"
    assert first["ArrayTaskId"] == "0" and second["ArrayTaskId"] == "1"
    merge = records[seen.good.merge]
    assert merge["Dependency"] == "(null)" and merge["JobName"] == "pitfalls-merge"
    assert merge["StartTime"] >= max(records[job]["EndTime"] for job in seen.good.tasks)
    # Slurm's own record of every finished job: each ran on the node.
    for job in (*seen.good.tasks, seen.good.merge):
        entry = completion(seen, records[job]["JobId"])
        assert entry["JobState"] == "COMPLETED" and entry["NodeList"] == seen.cluster.host, seen.completions


def measured(folder: Path, machine: str, head: str) -> dict[tuple[str, ...], float | None]:
    """BENCH's figures in a results folder, by parameter set; None for a set not run (asv writes NaN)."""
    (found,) = (folder / machine).glob(f"{head[:8]}-installed-*.json")
    values, params, *_ = json.loads(found.read_text())["results"][BENCH]
    return {key: None if value is None or math.isnan(value) else value
            for key, value in zip(itertools.product(*params), values, strict=True)}


def test_the_merged_site_holds_both_tasks_results(seen):
    merged = seen.fleet_dir / "results"
    assert {path.name for path in merged.iterdir() if path.is_dir()} == set(MACHINES)
    for task, machine in enumerate(MACHINES):
        own = seen.fleet_dir / f"results-{task}"
        assert {path.name for path in own.iterdir() if path.is_dir()} == {machine}
        figures = measured(own, machine, seen.head)
        # The one case the tasks ran: the static sampler makes no sync hazard, a real count read as 0.
        assert figures[("'static'", "1000", "1", "'cpu'")] == 0, figures
        assert measured(merged, machine, seen.head) == figures
    index = json.loads((seen.fleet_dir / "html" / "index.json").read_text())
    assert set(index["params"]["machine"]) == set(MACHINES)


def test_the_checkouts_results_are_unchanged(seen):
    assert seen.results_after == seen.results_before
    assert not git(seen.checkout, "status", "--porcelain", "--untracked-files=all")


def test_each_task_ran_in_a_clone_in_its_scratch_folder_which_it_removed(seen):
    scratch = seen.fleet_dir.parent / "scratch"
    clone = re.escape(str(scratch)) + r"/pitfalls-job\.\w+/suite"
    for task in seen.good.tasks:
        log = log_of(seen, task)
        assert re.search(rf"merged {clone}/results: 3 file\(s\) written into {seen.fleet_dir}/results-", log), log
    assert not list(scratch.glob("pitfalls-job.*"))


def test_a_failed_task_leaves_the_merge_cancelled_and_the_merged_results_untouched(seen):
    (task,) = seen.bad.tasks
    failed, merge = seen.bad.records[task], seen.bad.records[seen.bad.merge]
    assert failed["JobState"] == "FAILED" and failed["ExitCode"] != "0:0"
    assert "PITFALLS_GRID='bogus' is not a grid" in log_of(seen, task)
    assert merge["JobState"] == "CANCELLED" and merge["Reason"] == "DependencyNeverSatisfied", merge
    # It never ran: no node, no time, no log. The witness is Slurm's job-completion record, written as it cancels the
    # job, not scontrol's StartTime or RunTime: when the backfill pass is the one that finds the dependency broken,
    # Slurm 22.05 cancels the job (start = end = now) and then clears its start time (_job_runnable_test1), so
    # scontrol's RunTime reads the seconds since 1970 (a CI run saw 20792-08:29:51).
    entry = completion(seen, merge["JobId"])
    assert entry["JobState"] == "CANCELLED" and entry["NodeList"] == "(null)", entry
    assert entry["StartTime"] == entry["EndTime"] and merge["NodeList"] in ("", "(null)"), (entry, merge)
    assert log_of(seen, seen.bad.merge).startswith("(no log")
    assert seen.merged_after_bad == seen.merged_before_bad and seen.merged_before_bad


def test_the_cluster_leaves_nothing_running_listening_or_on_disk(seen):
    assert seen.left == []
    assert not seen.cluster.folder.exists()
    print(f"the Slurm fleet (a cluster, two fleets) took {seen.seconds:.0f} s")


@pytest.mark.parametrize("controller", ["up", "gone"])
def test_a_cluster_stopped_with_a_job_running_leaves_nothing(tmp_path, controller):
    """The test fails with a job still running, its controller up (the job is cancelled) or already gone (what is
    left of the job is found and stopped all the same)."""
    with pytest.raises(RuntimeError, match="planted"), local_cluster(tmp_path / "cluster") as cluster:
        job = cluster.client("sbatch", "--parsable", "--mem=100M", f"--output={tmp_path}/job.out",
                             "--wrap", "sleep 600").strip()
        cluster.wait([job], 30, until=("RUNNING",))
        # RUNNING comes before slurmstepd has started the script.
        deadline = time.monotonic() + 15
        while not {"slurmstepd", "sleep"} <= {process.name() for process in processes(cluster)}:
            assert time.monotonic() < deadline, [process.name() for process in processes(cluster)]
            time.sleep(0.2)
        if controller == "gone":
            pid = int(cluster.pid_file("slurmctld").read_text())
            os.kill(pid, signal.SIGKILL)
        raise RuntimeError("planted: the test fails with the job still running")
    assert stopped(cluster) == []

"""`pitfalls doctor` under torchrun: every rank runs the doctor, the ranks end each phase together, and rank 0 prints
the report of every rank; through torch's own launcher (`--nproc-per-node`, or `torchrun ... -m pitfalls doctor`),
meeting on loopback only."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from pitfalls import cli
from pitfalls.doctor import checks, planted
from pitfalls.doctor.planted import ddp

HERE = Path(__file__).resolve().parent
RANKS = HERE / "doctor_ranks"
QUICK = ["--warmup", "2", "--steps", "4", "--scanned", "2"]


def doctor(*argv: str, launcher: tuple[str, ...] = ("-m", "pitfalls", "doctor", "--nproc-per-node", "2"),
           cwd: Path | None = None) -> tuple[int, dict | None, str]:
    done = subprocess.run([sys.executable, *launcher, "--json", *QUICK, *argv], capture_output=True, text=True,
                          timeout=300, cwd=cwd)
    data = json.loads(done.stdout) if done.stdout.strip().startswith("{") else None
    return done.returncode, data, done.stderr


def line_of(path: Path, text: str) -> int:
    (found,) = [n for n, line in enumerate(path.read_text().splitlines(), start=1) if text in line]
    return found


def test_a_sync_on_rank_0_only_is_reported_so_with_every_ranks_step_time_and_ddps_all_reduces():
    world = checks.run_ranks()
    assert world["world_size"] == 2 and [r["rank"] for r in world["ranks"]] == [0, 1] and world["exit_status"] == 0
    line = line_of(planted.DDP, "loss.item()")
    zero, one = ([f for f in r["findings"] if f["line"] == line and f["kind"] == "sync"] for r in world["ranks"])
    (item,) = zero
    assert one == [] and (item["per_step"], item["per_step_by_rank"], item["only_on_ranks"]) == (1.0, [1.0, 0.0], [0])
    assert item["wait_on_other_ranks"] == "its stall, cost not measurable on a CPU"
    for report in world["ranks"]:
        steps = report["steps"]
        assert (steps["warmup"], steps["measured"], steps["before_scan"], steps["scanned"]) == (2, 4, 1, 2)
        assert report["ended"] == f"stopped: its {steps['total']} steps are done" and report["step_ms"]["mean"] > 0
        # Four micro-batches a step, none under no_sync: four all-reduces of the one bucket.
        figures = report["ddp"]
        assert (figures["modules"], figures["buckets"], figures["bucket_bytes"]) == (1, 1, ddp.BUCKET_BYTES)
        assert (figures["reductions_per_step"], figures["bytes_per_step"]) == (4.0, 4.0 * ddp.BUCKET_BYTES)
        assert figures["samples"] >= 3 and figures["comm_ms"] > 0
    assert world["slowest_rank"] in (0, 1)


def test_a_rank_that_raises_ends_the_run_and_every_ranks_report_is_kept():
    code, world, err = doctor(str(RANKS / "rank_raises.py"))
    assert code == 1, err[-3000:]
    zero, one = world["ranks"]
    assert one["error"]["last_line"] == "ValueError: planted failure on rank 1 in step 5" and one["exit_status"] == 1
    assert zero["error"] is not None and zero["steps"]["total"] == one["steps"]["total"] == 4
    assert world["first_to_end"] == "rank 1 the script raised after 4 steps"
    assert any("the scanned steps" in line and "not run" in line for line in zero["not_measured"])


def test_torchrun_itself_runs_the_doctor_in_each_rank():
    launcher = ("-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "pitfalls", "doctor")
    code, world, err = doctor(str(planted.DDP), launcher=launcher)
    assert code == 0, err[-3000:]
    assert [report["ddp"]["reductions_per_step"] for report in world["ranks"]] == [4.0, 4.0]


@pytest.mark.cuda_build
def test_a_cuda_written_ddp_script_reads_its_two_blocking_copies_on_each_rank(tmp_path):
    path = HERE / "doctor_cuda" / "ddp_train.py"
    code, world, err = doctor("--cuda-on-cpu", str(path), "--", "50", cwd=tmp_path)
    assert code == 0, err[-3000:]
    wanted = {line_of(path, "source = source.to(gpu)"), line_of(path, "targets = targets.to(gpu)")}
    for report in world["ranks"]:
        syncs = {(f["line"], f["per_step"], f["rule"]) for f in report["findings"] if f["kind"] == "sync"}
        assert syncs == {(line, 1.0, "blocking copy to the device") for line in wanted}, report["rank"]
        assert all("non_blocking=True" in f["fix"] for f in report["findings"] if f["kind"] == "sync")
        assert report["cuda_on_cpu"]["calls"]["nccl -> gloo"] == 1


def test_the_launcher_and_the_ranks_listen_on_loopback_only():
    command = [sys.executable, "-m", "pitfalls", "doctor", "--nproc-per-node", "2", *QUICK, "--budget", "60",
               str(planted.DDP)]
    launched = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    listening: set[tuple[str, int]] = set()
    try:
        while launched.poll() is None:
            tree = {launched.pid, *(p.pid for p in psutil.Process(launched.pid).children(recursive=True))}
            listening |= {(c.laddr.ip, c.pid) for c in psutil.net_connections(kind="inet")
                          if c.status == psutil.CONN_LISTEN and c.pid in tree}
            time.sleep(0.1)
    finally:
        launched.kill()
        launched.wait()
    assert launched.returncode == 0
    assert listening and {ip for ip, _pid in listening} == {"127.0.0.1"}, listening


@pytest.mark.parametrize(("argv", "env", "message"), [
    (["--nproc-per-node", "2", "--try", "loader"], {}, "--try runs the script again in fresh processes"),
    (["--nproc-per-node", "2"], {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1",
                                 "TORCHELASTIC_USE_AGENT_STORE": "True"}, "--nproc-per-node starts the ranks itself"),
    ([], {"RANK": "1", "WORLD_SIZE": "2"}, "without torchrun's RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT"),
    ([], {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"},
     "whose agent hosts no store for its ranks"),
])
def test_bad_launches_are_one_line_and_exit_2(monkeypatch, capsys, argv, env, message):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert cli.main(["doctor", *argv, str(planted.DDP)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("pitfalls doctor: ") and message in line

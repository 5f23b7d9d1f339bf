"""The parallel family: the same step on every variant, torchrun's ranks driven from one process, its faults."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
import torch

from pitfalls import cli, registry
from pitfalls.families import parallel, parallel_step
from pitfalls.families.parallel import compare_updates, make_runner, one_step_update
from pitfalls.families.parallel_launch import RANK_MODULE, RankFailed, RankGroup, free_port
from pitfalls.families.parallel_step import (
    DATA_PARALLEL,
    DATA_PARALLEL_LOSS_INSIDE,
    DDP,
    SINGLE,
    StepConfig,
    make_trainer,
)
from pitfalls.family import SkipCase
from pitfalls.probes import Unavailable

ROOT = Path(__file__).resolve().parents[1]
FAMILY = parallel.FAMILY
CPU = torch.device("cpu")
TWO_GPUS = torch.cuda.device_count() >= 2
# The equivalence tolerance: in float64 (the gate's dtype) the updates of a variant and of `single` may differ by
# at most this share of the largest update; float rounding alone gives about 1e-15.
TOLERANCE = parallel.UPDATE_RTOL
assert TOLERANCE <= 1e-9


def rank_script(tmp_path: Path, body: str) -> list[str]:
    """A torchrun entry that changes the rank module in the given way, then runs it (what a test rank does)."""
    path = tmp_path / "rank.py"
    path.write_text(textwrap.dedent(body) + "\nimport sys\nfrom pitfalls.families import parallel_rank\n"
                    "sys.exit(parallel_rank.main())\n", encoding="utf-8")
    return [str(path)]


def alive(pids) -> list[int]:
    """The pids still running (a zombie has exited)."""
    running = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                running.append(pid)
        except psutil.NoSuchProcess:
            pass
    return running


@pytest.fixture
def no_process_left():
    """Fails the test if it leaves a child process (torchrun, a rank) behind."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    yield
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    assert alive(p.pid for p in left) == [], [p.cmdline() for p in left]


# --- the entry and its data -------------------------------------------------------------------------------------


def test_the_entry_single_first_no_floor_and_only_the_figures_that_apply():
    assert registry.family("parallel") is FAMILY
    assert FAMILY.variants == (SINGLE, DATA_PARALLEL, DATA_PARALLEL_LOSS_INSIDE, DDP)
    assert FAMILY.baseline == SINGLE and not FAMILY.floor and FAMILY.cases == FAMILY.variants
    assert FAMILY.figures == {"time", "speedup"}
    assert FAMILY.param_names == ("world_size", "batch", "image_size")
    assert FAMILY.axes("quick") == {"world_size": (1, 2), "batch": (4,), "image_size": (64,)}
    with pytest.raises(ValueError, match="nothing to torch.compile"):
        FAMILY.build(SINGLE, compiled=True)


def test_every_rank_gets_its_own_share_of_the_one_global_batch():
    images, labels = parallel_step.seeded_images(0, 6, 16, 10, seed=3)
    for rank in range(3):
        mine = parallel_step.seeded_images(rank * 2, 2, 16, 10, seed=3)
        assert torch.equal(mine[0], images[rank * 2:rank * 2 + 2])
        assert torch.equal(mine[1], labels[rank * 2:rank * 2 + 2])
    assert not torch.equal(parallel_step.seeded_images(0, 1, 16, 10, seed=4)[0], images[:1])
    # Every image holds as many ignored pixels (-1 and the background 9), so per-rank means average to the whole
    # batch's mean; the valid labels are spread over the other classes.
    per_image = [(int((x == -1).sum()), int((x == 9).sum())) for x in labels]
    assert set(per_image) == {(256 // 11, 256 // 11)}
    assert int(labels.min()) == -1 and int(labels.max()) == 9 and len(labels.unique()) == 11


def test_the_memory_estimate_is_the_whole_global_batch_on_one_device():
    assert FAMILY.estimate_bytes({"world_size": 4, "batch": 8}) == FAMILY.estimate_bytes({"world_size": 1, "batch": 32})
    with pytest.raises(SkipCase, match="needs about .* GiB on cpu"):
        FAMILY.build(SINGLE, world_size=1024, batch=1024, image_size=512)


@pytest.mark.skipif(TWO_GPUS, reason="checks the skip on a machine with fewer than 2 GPUs")
@pytest.mark.parametrize("variant", [DATA_PARALLEL, DATA_PARALLEL_LOSS_INSIDE])
def test_data_parallel_is_skipped_with_the_reason_without_two_gpus(variant, no_process_left):
    with pytest.raises(SkipCase, match="needs 2 or more CUDA devices"):
        FAMILY.build(variant, device="cpu")
    row = FAMILY.compare(variant, "cpu")
    assert not row.matches and math.isnan(row.max_abs_diff)
    assert "needs 2 or more CUDA devices" in row.skipped


def test_more_ranks_than_cores_is_a_skip_before_any_process_starts(no_process_left):
    cores = parallel.usable_cpus()
    with pytest.raises(SkipCase, match=f"world_size={cores + 1} needs {cores + 1} CPU cores"):
        FAMILY.build(DDP, device="cpu", world_size=cores + 1)


def test_figures_that_do_not_apply_say_why():
    trainer = make_trainer(SINGLE, CPU, StepConfig(world_size=1, batch=1, image_size=8))
    assert trainer.communication() == Unavailable("one device: nothing is communicated")
    [only] = trainer.measure()
    assert only.rank == 0 and only.memory == "USS" and only.peak_bytes > 0 and only.seconds > 0
    figures = parallel.ParallelFigures(1.0, 8.0, (only,), Unavailable("x"), Unavailable("no GPU"))
    assert isinstance(figures.memory_imbalance(), Unavailable)
    assert isinstance(figures.others_busy(), Unavailable)
    half = dataclasses.replace(only, rank=1, peak_bytes=only.peak_bytes // 2)
    two = parallel.ParallelFigures(1.0, 8.0, (only, half), 0.1, (90.0, 30.0, 60.0))
    assert two.memory_imbalance() == pytest.approx(2.0, rel=1e-3)
    assert two.rank0_busy() == 90.0 and two.others_busy() == 45.0


def test_communication_counts_overlapping_transfers_once_and_only_communication():
    cpu, cuda = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA

    def event(name, start, end, device=cpu):
        return SimpleNamespace(name=name, device_type=device, time_range=SimpleNamespace(start=start, end=end))

    events = [event("gloo:all_reduce", 0, 100), event("gloo:broadcast", 50, 150), event("aten::conv2d", 0, 900),
              event("gloo:all_reduce", 300, 400), event("ncclDevKernel_AllReduce", 0, 500, cuda)]
    assert parallel_step.communication_seconds(events, on_gpu=False) == pytest.approx(250e-6)
    gpu = [event("ncclDevKernel_AllReduce_Sum_f32", 0, 100, cuda), event("Memcpy PtoP (Device -> Device)", 80, 120,
           cuda), event("void at::native::conv", 0, 1000, cuda), event("nccl:all_reduce", 0, 5000)]
    assert parallel_step.communication_seconds(gpu, on_gpu=True) == pytest.approx(120e-6)


# --- equivalence ------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_two_gloo_ranks_make_the_same_update_as_single_and_a_wrong_rank_is_caught(tmp_path, no_process_left):
    # At the quick grid's size, in float64: 2 ranks of 4 images of 64x64 against single on all 8.
    config = StepConfig(world_size=2, batch=4, image_size=64, dtype=parallel.GATE_DTYPE)
    want = one_step_update(make_trainer(SINGLE, CPU, config), config)
    scale = max(float(w.abs().max()) for w in want.values())
    group = make_runner(DDP, CPU, config)
    try:
        got = one_step_update(group, config)
    finally:
        group.close()
    worst, differing = compare_updates(got, want)
    assert differing == [] and worst <= TOLERANCE * scale
    # The same check catches a step that is only nearly right: every rank training on rank 0's images.
    wrong = RankGroup(config, "cpu", entry=rank_script(tmp_path, """
        from pitfalls.families import parallel_step
        real = parallel_step.seeded_images
        parallel_step.seeded_images = lambda first, *rest, **kw: real(0, *rest, **kw)
    """))
    try:
        bad = one_step_update(wrong, config)
    finally:
        wrong.close()
    worst, differing = compare_updates(bad, want)
    assert differing and worst > 1e-3 * scale


@pytest.mark.slow
def test_the_gate_runs_ddp_on_two_gloo_ranks_and_reports_the_rest(no_process_left, capsys):
    assert cli.main(["check", "--device", "cpu"]) == 0
    cells = [[c.strip() for c in line.split("│")[1:-1]] for line in capsys.readouterr().out.splitlines()]
    rows = {c[1]: c for c in cells if c and c[0] == "parallel"}
    assert set(rows) == set(FAMILY.variants)
    assert rows[DDP][3] == rows[SINGLE][3] == "yes" and float(rows[DDP][4]) <= 1e-12
    if not TWO_GPUS:
        assert rows[DATA_PARALLEL][3] == "n/a" and rows[DATA_PARALLEL][4] == "n/a"
        assert rows[DATA_PARALLEL][7].startswith("not run here: data_parallel needs")


@pytest.mark.gpu
@pytest.mark.skipif(not TWO_GPUS, reason="needs 2 or more CUDA devices")
@pytest.mark.parametrize("variant", [DATA_PARALLEL, DATA_PARALLEL_LOSS_INSIDE, DDP])
def test_on_two_gpus_every_variant_makes_single_s_update(variant, no_process_left):
    row = FAMILY.compare(variant, "cuda")
    assert row.matches and math.isfinite(row.max_abs_diff), row


# --- the ranks: driven, measured, failing ---------------------------------------------------------------------


@pytest.mark.slow
def test_a_ddp_case_times_steps_of_ranks_that_stay_alive_and_measures_each_rank(no_process_left):
    case = FAMILY.build(DDP, device="cpu", world_size=2, batch=2, image_size=16)
    try:
        group = case.call
        pids = list(group.rank_pids)
        assert len(pids) == 2 and all(p not in (os.getpid(),) for p in pids)
        losses = [case() for _ in range(3)]
        assert all(math.isfinite(loss) for loss in losses) and losses[2] < losses[0]  # it trains
        assert alive(pids) == pids  # the same two processes served every step
        ranks = group.measure()
        assert [r.rank for r in ranks] == [0, 1] and {r.pid for r in ranks} == set(pids)
        assert all(r.memory == "USS" and r.peak_bytes > 0 and r.seconds > 0 for r in ranks)
        communication = group.communication()
        assert isinstance(communication, float) and communication > 0
        figures = parallel.measure_figures(case, min_run_time=0.2, nvml_seconds=0.1)
        assert figures.samples_per_s == pytest.approx(4 / figures.step_s)
        assert len(figures.ranks) == 2 and 0.2 < figures.memory_imbalance() < 5
        assert figures.busy_pct == Unavailable("case runs on cpu: no GPU for NVML to read")
    finally:
        case.close()
    assert alive(pids) == []


@pytest.mark.slow
def test_a_rank_that_raises_ends_the_run_with_its_traceback_and_leaves_nothing(tmp_path, no_process_left):
    entry = rank_script(tmp_path, """
        from pitfalls.families import parallel_rank
        real = parallel_rank.execute
        def execute(trainer, command, rank):
            if command == "step" and rank == 1:
                raise RuntimeError("rank 1 was told to fail")
            return real(trainer, command, rank)
        parallel_rank.execute = execute
    """)
    # The step timeout is long: the run must end because of the error, not because nothing answered.
    group = RankGroup(StepConfig(world_size=2, batch=1, image_size=8), "cpu", entry=entry, step_timeout_s=300)
    pids = list(group.rank_pids)
    with pytest.raises(RankFailed) as failure:
        group()
    message = str(failure.value)
    assert message.startswith("rank 1 (")
    assert "Traceback (most recent call last)" in message and "RuntimeError: rank 1 was told to fail" in message
    assert "did not report" not in message
    assert alive([group.process.pid, *pids]) == []
    with pytest.raises(RankFailed, match="closed"):
        group()


@pytest.mark.slow
def test_the_gate_fails_a_variant_whose_rank_raises(tmp_path, monkeypatch, no_process_left):
    entry = rank_script(tmp_path, """
        from pitfalls.families import parallel_rank
        def execute(trainer, command, rank):
            raise RuntimeError(f"rank {rank} cannot step")
        parallel_rank.execute = execute
    """)
    monkeypatch.setattr(parallel, "RankGroup", functools.partial(RankGroup, entry=entry))
    row = FAMILY.compare(DDP, "cpu")
    assert not row.matches and row.max_abs_diff == math.inf
    assert row.detail.startswith("rank ") and row.detail.endswith("cannot step"), row.detail


@pytest.mark.slow
def test_a_rank_that_fails_while_starting_is_reported(tmp_path, no_process_left):
    entry = rank_script(tmp_path, """
        import os
        from pitfalls.families import parallel_rank
        if os.environ["RANK"] == "0":
            parallel_rank.init_rank = lambda args: (_ for _ in ()).throw(ValueError("no such device here"))
    """)
    with pytest.raises(RankFailed, match=r"(?s)rank 0 \(.*ValueError: no such device here"):
        RankGroup(StepConfig(world_size=2, batch=1, image_size=8), "cpu", entry=entry)


@pytest.mark.slow
def test_a_rank_killed_without_a_word_is_reported_with_torchrun_s_account(no_process_left):
    group = RankGroup(StepConfig(world_size=2, batch=1, image_size=8), "cpu", step_timeout_s=300)
    killed = group.rank_pids[1]
    os.kill(killed, signal.SIGKILL)
    with pytest.raises(RankFailed) as failure:
        group()
    # The survivor's error comes first (its peer vanished), then torchrun's account of the first failure.
    message = str(failure.value)
    assert "torchrun output" in message and "did not report" not in message
    assert f"Signal 9 (SIGKILL) received by PID {killed}" in message
    assert alive([group.process.pid, *group.rank_pids]) == []


@pytest.mark.slow
def test_a_port_in_use_is_retried_on_another(no_process_left):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        other = free_port()
        group = RankGroup(StepConfig(world_size=2, batch=1, image_size=8), "cpu", ports=iter([busy, other]))
        try:
            assert group.ports_tried == [busy, other]
            assert math.isfinite(group())
        finally:
            group.close()


@pytest.mark.slow
def test_ranks_exit_when_the_process_driving_them_dies(tmp_path):
    # asv's benchmark processes may end without closing anything: the ranks must not outlive them.
    script = textwrap.dedent("""
        import json, os, sys
        from pitfalls.families.parallel import StepConfig
        from pitfalls.families.parallel_launch import RankGroup
        group = RankGroup(StepConfig(world_size=2, batch=1, image_size=8), "cpu")
        group()
        print(json.dumps([group.process.pid, *group.rank_pids]), flush=True)
        os._exit(0)  # no close, no atexit, no finalizer
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    pids = json.loads(done.stdout.strip().splitlines()[-1])
    deadline = time.monotonic() + 120
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert alive(pids) == []


# --- the command line and the multi-node form -------------------------------------------------------------------


@pytest.mark.slow
def test_probe_runs_a_ddp_case_through_the_generic_command_and_stops_its_ranks():
    probe = subprocess.Popen(
        [sys.executable, "-m", "pitfalls.cli", "probe", "parallel", "ddp", "--world-size", "2", "--batch", "2",
         "--image-size", "16", "--rounds", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    out, err = probe.communicate(timeout=600)
    assert probe.returncode == 0, err[-3000:]
    assert "parallel/ddp world_size=2 batch=2 image_size=16 cpu eager" in out
    assert "speedup over single" in out and "does not apply to the parallel family" in out
    # The command does not close its cases; the group's finalizer stops the ranks when the interpreter exits.
    mine = f"--launcher-pid {probe.pid}"
    ranks = [p.pid for p in psutil.process_iter(["cmdline"]) if mine in " ".join(p.info["cmdline"] or ())]
    assert alive(ranks) == []


@pytest.mark.slow
def test_two_nodes_each_with_its_own_torchrun_write_their_ranks_and_one_summary(tmp_path, no_process_left):
    # Two torchrun commands as on two machines, here both on 127.0.0.1: c10d rendezvous, one rank per node.
    port = free_port()
    commands = [
        [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
         f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=pitfalls-test", "--max-restarts=0", "-m", RANK_MODULE,
         "--device", "cpu", "--batch", "2", "--image-size", "16", "--steps", "3", "--out", str(tmp_path / f"node{n}")]
        for n in range(2)
    ]
    nodes = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for c in commands]
    outputs = [node.communicate(timeout=300)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs
    files = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.json"))
    [summary_path] = [f for f in files if f.endswith("summary.json")]
    assert len([f for f in files if "/rank" in f]) == 2
    summary = json.loads((tmp_path / summary_path).read_text())
    assert summary["world_size"] == 2 and summary["global_batch"] == 4
    assert [r["rank"] for r in summary["ranks"]] == [0, 1]
    assert sorted(r["node_rank"] for r in summary["ranks"]) == [0, 1]
    assert summary["samples_per_s"] == pytest.approx(4 / summary["step_s"])
    for rank in summary["ranks"]:
        assert rank["peak_bytes"] > 0 and rank["communication_s"] > 0 and rank["gpu_busy_pct"] == "no CUDA device"

"""The parallel family: the same step on every variant, torchrun's ranks driven from one process, its faults."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import itertools
import json
import math
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
import torch
from torch.distributed import TCPStore

from pitfalls import cli, devices, registry
from pitfalls.distributed import RankFailed, loopback_store, step_seconds, time_steps
from pitfalls.distributed.control import LOOPBACK
from pitfalls.families.parallel import checks as parallel_calibration
from pitfalls.families.parallel import entry as parallel
from pitfalls.families.parallel import launch as parallel_launch
from pitfalls.families.parallel import memory as parallel_memory
from pitfalls.families.parallel import step as parallel_step
from pitfalls.families.parallel.entry import compare_updates, make_runner
from pitfalls.families.parallel.launch import RANK_MODULE, DdpGroup
from pitfalls.families.parallel.step import (
    DATA_PARALLEL,
    DATA_PARALLEL_LOSS_INSIDE,
    DDP,
    SINGLE,
    VARIANTS,
    Shard,
    StepConfig,
    make_trainer,
)
from pitfalls.family import Case, SkipCase
from pitfalls.known.table import verdict
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
    path.write_text(textwrap.dedent(body) + "\nimport sys\n"
                    "from pitfalls.families.parallel import rank as parallel_rank\n"
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
    assert FAMILY.param_names == ("world_size", "batch", "image_size", "model")
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


def test_on_the_cpu_every_process_steps_on_one_core_s_threads_and_gets_its_own_back():
    # One core is one CPU device: `single` in this process and every gloo rank step on as many threads, so that
    # ddp's speedup over single is its scaling, not single's two threads waiting on each other on shared cores.
    trainer = make_trainer(SINGLE, CPU, StepConfig(world_size=2, batch=1, image_size=8))
    seen = []
    forward = trainer.forward
    trainer.forward = lambda x, y: (seen.append(torch.get_num_threads()), forward(x, y))[1]
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        trainer.step()
        trainer.block(2)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert seen and set(seen) == {devices.CPU_DEVICE_THREADS} == {1}
    assert "--threads 1 " in " ".join(parallel_launch.rank_arguments(trainer.config, "cpu", devices.CPU_DEVICE_THREADS))


def test_a_reply_above_the_store_s_message_limit_goes_in_parts_and_comes_back_whole():
    from pitfalls.distributed import control

    store = loopback_store(10)
    # Empty, small, at the limit, above it, many parts, and a small value that starts like the parts' marker.
    values = [b"", b"ok", os.urandom(control.PART_BYTES), os.urandom(3 * control.PART_BYTES + 7),
              os.urandom(20 * 2**20), control._PARTS + b"3"]
    for index, value in enumerate(values):
        control.set_value(store, f"reply/{index}", value)
        assert control.get_value(store, f"reply/{index}") == value, index
    assert store.num_keys() == len(values)  # the parts were deleted once read


def test_the_wide_net_holds_gradients_for_several_ddp_buckets_and_segnet_for_one():
    # DDP's first bucket holds 1 MiB, the others bucket_cap_mb = 25 MiB.
    sizes = {}
    for model in parallel_step.MODELS:
        net = parallel_step.initial_net(StepConfig(world_size=1, batch=1, image_size=8, model=model))
        sizes[model] = sum(p.numel() for p in net.parameters())
        assert sizes[model] == parallel_step.parameter_count(model)
    assert 4 * sizes[parallel_step.SEGNET] < 2**20 < 25 * 2**20 < 4 * sizes[parallel_step.WIDE]
    with pytest.raises(ValueError, match=r"model='huge' is not allowed; allowed: segnet, wide"):
        StepConfig(world_size=1, batch=1, image_size=8, model="huge")
    wide = parallel.device_estimates(DDP, {"world_size": 2, "batch": 4, "image_size": 64, "model": "wide"})
    small = parallel.device_estimates(DDP, {"world_size": 2, "batch": 4, "image_size": 64, "model": "segnet"})
    assert wide[0] - small[0] == 4 * 4 * (sizes["wide"] - sizes["segnet"])  # weights, gradients, momentum, buckets


def test_memory_is_estimated_per_device():
    params = {"world_size": 4, "batch": 8, "image_size": 512}
    [single] = parallel.device_estimates(SINGLE, params)
    ddp = parallel.device_estimates(DDP, params)
    data_parallel = parallel.device_estimates(DATA_PARALLEL, params)
    weights = 4 * 4 * parallel_step.parameter_count(parallel_step.SEGNET)  # weights, gradients, momentum, buckets
    # Each rank holds 1/W of the batch's memory, and the whole net.
    assert len(ddp) == 4 and len(set(ddp)) == 1 and 4 * (ddp[0] - weights) == single - weights
    # DataParallel's device 0 also holds the gathered logits of the whole global batch, their loss and gradient.
    assert data_parallel[1:] == ddp[1:] and data_parallel[0] - ddp[0] == 3 * 4 * 10 * 32 * 512 * 512
    assert parallel.device_estimates(DATA_PARALLEL_LOSS_INSIDE, params) == ddp
    assert FAMILY.estimate_bytes(params) == ddp[0]
    with pytest.raises(SkipCase, match="needs about .* GiB on cpu"):
        FAMILY.build(SINGLE, world_size=1024, batch=1024, image_size=512)


def test_on_a_fake_80_gb_device_the_full_grid_s_ddp_cases_are_not_skipped(monkeypatch):
    monkeypatch.setattr(devices, "free_memory_bytes", lambda device: 80 * 10**9)
    grid = FAMILY.grids["full"]
    skipped = {}
    for world_size, batch, image_size in itertools.product(grid["world_size"], grid["batch"], grid["image_size"]):
        config = StepConfig(world_size=world_size, batch=batch, image_size=image_size)
        for variant in VARIANTS:
            try:
                parallel.check_memory(variant, torch.device("cuda"), config)
            except SkipCase as skip:
                skipped[variant, world_size, batch, image_size] = skip.reason
    assert not [key for key in skipped if key[0] == DDP], skipped
    # The one-device step of 8 x 32 images of 512 x 512 does not fit (about 122 GiB): single is skipped there.
    assert (SINGLE, 8, 32, 512) in skipped and "GiB on cuda:0" in skipped[SINGLE, 8, 32, 512]
    # DataParallel's device 0 is what stops it first.
    assert all(reason.startswith(f"{key[0]}: ") for key, reason in skipped.items())


def test_the_largest_batch_search_finds_the_edge_of_a_fake_device_memory():
    fake = 80 * 10**9  # an 80 GB GPU, in the estimate's terms: a try fits when every device holds its share
    found = {}
    for variant in VARIANTS:
        tries = []

        def fits(batch, variant=variant, tries=tries):
            tries.append(batch)
            params = {"world_size": 4, "batch": batch, "image_size": 512}
            return max(parallel.device_estimates(variant, params)) <= fake

        found[variant] = parallel_memory.largest_fitting(fits)
        assert fits(found[variant]) and not fits(found[variant] + 1)
        assert len(tries) <= 2 * math.ceil(math.log2(parallel_memory.BATCH_LIMIT)) + 3
    # The article's claim in numbers: DataParallel's device 0 holds the gathered outputs, so its batch is smaller.
    assert found[DATA_PARALLEL] < found[DATA_PARALLEL_LOSS_INSIDE] == found[DDP]
    assert found[SINGLE] == found[DDP] // 4  # one device holds the whole global batch of 4 ranks
    assert parallel_memory.largest_fitting(lambda n: False) == Unavailable("not even 1 image per rank fits")
    assert parallel_memory.largest_fitting(lambda n: True, limit=100) == 100


def test_the_largest_batch_search_stops_at_its_time_limit_with_what_it_settled():
    # A fake clock that each try moves 10 s on; the edge is at 300 images: the deadline at 45 s allows 5 tries.
    now = [0.0]

    def fits(batch: int) -> bool:
        now[0] += 10
        return batch <= 300

    stopped = parallel_memory.largest_fitting(fits, deadline=45, clock=lambda: now[0])
    assert stopped == parallel_memory.Stopped(low=16, high=None)  # 1, 2, 4, 8, 16 ran; 32 was not tried
    now[0] = 0.0
    bisecting = parallel_memory.largest_fitting(fits, deadline=105, clock=lambda: now[0])
    assert bisecting == parallel_memory.Stopped(low=256, high=384)  # 512 failed, then 384
    now[0] = 0.0
    assert parallel_memory.largest_fitting(fits, deadline=10**6, clock=lambda: now[0]) == 300


def test_the_largest_batch_search_measures_and_is_not_stopped_by_the_estimate(monkeypatch):
    # A planted estimate that refuses everything: the family's build skips the case, the search's build does not.
    monkeypatch.setattr(parallel, "fits", lambda device, needed: (False, "planted: the estimate says no"))
    config = parallel_step.StepConfig(world_size=1, batch=2, image_size=16)
    with pytest.raises(SkipCase, match="planted: the estimate says no"):
        parallel.check_memory(SINGLE, torch.device("cpu"), config)
    with parallel.estimates_off():
        parallel.check_memory(SINGLE, torch.device("cpu"), config)
    with pytest.raises(SkipCase):
        parallel.check_memory(SINGLE, torch.device("cpu"), config)  # on again after the block


def test_the_proofs_largest_batch_reads_the_search_bound_and_a_skip_as_what_they_are(monkeypatch):
    from pitfalls.gpu_run.checks import largest_global_batch

    params = {"world_size": 2, "image_size": 512}
    monkeypatch.setattr(parallel_memory, "fits_on_gpu", lambda *a: lambda n: n <= 37)
    assert largest_global_batch(DDP, params) == 74
    monkeypatch.setattr(parallel_memory, "fits_on_gpu", lambda *a: lambda n: True)
    limit = parallel_memory.BATCH_LIMIT
    assert largest_global_batch(DDP, params) == (
        f">= {2 * limit} (the search stops at {limit} images per rank)")

    def skipped(n: int) -> bool:
        raise SkipCase("world_size=2 needs 2 CUDA devices; this machine has 1")

    monkeypatch.setattr(parallel_memory, "fits_on_gpu", lambda *a: skipped)
    assert largest_global_batch(DDP, params) == (
        "unavailable: world_size=2 needs 2 CUDA devices; this machine has 1")


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
    assert only.rank == 0 and only.memory == parallel_step.STEP_PEAK and only.peak_bytes > 0 and only.seconds > 0
    figures = parallel.ParallelFigures(1.0, 8.0, (only,), Unavailable("x"), Unavailable("no GPU"))
    assert isinstance(figures.memory_imbalance(), Unavailable)
    assert isinstance(figures.others_busy(), Unavailable)
    grown = dataclasses.replace(only, peak_bytes=2 << 20)
    half = dataclasses.replace(grown, rank=1, peak_bytes=1 << 20)
    two = parallel.ParallelFigures(1.0, 8.0, (grown, half), 0.1, (90.0, 30.0, 60.0))
    assert two.memory_imbalance() == 2.0
    still = dataclasses.replace(half, peak_bytes=0)
    assert parallel.ParallelFigures(1.0, 8.0, (grown, still), 0.1, Unavailable("x")).memory_imbalance() == Unavailable(
        "the other ranks held nothing at their step's peak: no ratio")
    assert two.rank0_busy() == 90.0 and two.others_busy() == 45.0


def test_weak_scaling_is_w_ranks_samples_over_w_times_one_rank_s_and_says_why_when_it_cannot_be():
    def rate(samples_per_s):
        return parallel.ParallelFigures(1.0, samples_per_s, Unavailable("x"), Unavailable("x"), Unavailable("x"))

    # 2 ranks at 150 samples/s against one rank's 100: each rank does 75 % of a lone rank's work per second.
    assert parallel.scaling_efficiency(DDP, 2, rate(150.0), rate(100.0)) == pytest.approx(0.75)
    assert parallel.scaling_efficiency(DDP, 4, rate(400.0), rate(100.0)) == pytest.approx(1.0)
    reasons = {
        str(parallel.scaling_efficiency(SINGLE, 2, rate(150.0), rate(100.0))): "ddp's figure",
        str(parallel.scaling_efficiency(DDP, 1, rate(100.0), rate(100.0))): "the reference",
        str(parallel.scaling_efficiency(DDP, 2, rate(150.0), None)): "no 1-rank ddp case",
        str(parallel.scaling_efficiency(DDP, 2, rate(150.0), "needs 2 CPU cores")): "did not run: needs 2 CPU cores",
        str(parallel.scaling_efficiency(DDP, 2, rate(150.0), rate(Unavailable("failed: hung")))): "failed: hung",
    }
    for reason, wanted in reasons.items():
        assert wanted in reason, reason


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


def _wrong_group(tmp_path, body):
    """A `DdpGroup` factory whose ranks run the rank module changed by ``body`` (a planted fault)."""
    return functools.partial(DdpGroup, entry=rank_script(tmp_path, body))


@pytest.mark.slow
def test_two_gloo_ranks_make_single_s_two_steps_on_every_rank_and_a_wrong_rank_is_caught(tmp_path, no_process_left):
    # At the quick grid's size, in float64: 2 ranks of 4 images of 64x64 against single on all 8, two steps, so
    # that the momentum buffer is used, on every rank.
    config = StepConfig(world_size=2, batch=4, image_size=64, dtype=parallel.GATE_DTYPE)
    [want] = parallel.updates_after(make_trainer(SINGLE, CPU, config), config)
    assert any(name.startswith("momentum.") for name in want)
    scale = max(float(w.abs().max()) for w in want.values())
    group = make_runner(DDP, CPU, config)
    try:
        got = parallel.updates_after(group, config)
        shards = group.shards()
    finally:
        group.close()
    assert len(got) == 2
    for state in got:
        worst, differing = compare_updates(state, want)
        assert differing == [] and worst <= TOLERANCE * scale
    assert parallel.check_shards(shards, config) == []
    # The same check catches a step that is only nearly right: every rank training on rank 0's images.
    wrong = _wrong_group(tmp_path, """
        from pitfalls.families.parallel import step as parallel_step
        real = parallel_step.seeded_images
        parallel_step.seeded_images = lambda first, *rest, **kw: real(0, *rest, **kw)
    """)(config, "cpu")
    try:
        bad = parallel.updates_after(wrong, config)
        bad_shards = wrong.shards()
    finally:
        wrong.close()
    worst, differing = compare_updates(bad[0], want)
    assert differing and worst > 1e-3 * scale
    assert any("are not images 4..7" in fault for fault in parallel.check_shards(bad_shards, config))


def test_the_shard_check_sees_a_rank_on_the_whole_batch_and_a_skipped_shard():
    config = StepConfig(world_size=2, batch=2, image_size=8)
    images, _ = parallel_step.seeded_images(0, 4, 8, 10, seed=0)
    good = [Shard.of(0, images[:2]), Shard.of(2, images[2:])]
    assert parallel.check_shards(good, config) == []
    whole = [Shard.of(0, images), Shard.of(2, images[2:])]
    assert parallel.check_shards(whole, config) == ["images [2, 3] were trained on by more than one rank"]
    skipped = [Shard.of(0, images[:2]), Shard.of(0, images[:2])]
    assert parallel.check_shards(skipped, config) == ["images [0, 1] were trained on by more than one rank",
                                                      "images [2, 3] were trained on by no rank"]
    lying = [Shard.of(0, images[:2]), Shard.of(2, images[:2])]
    [fault] = parallel.check_shards(lying, config)
    assert "rank 1's images are not images 2..3" in fault


@pytest.mark.slow
@pytest.mark.parametrize("fault, want", [
    # A rank that trains on the whole global batch: the averaged gradient is single's, the work W times.
    ("""
        from pitfalls.families.parallel import step as parallel_step
        real = parallel_step.make_trainer
        def make_trainer(variant, device, config, *, rank=0, **options):
            whole = parallel_step.StepConfig(world_size=1, batch=config.global_batch, image_size=config.image_size,
                                             dtype=config.dtype)
            trainer = real(parallel_step.SINGLE, device, whole)
            ddp = real(variant, device, config, rank=rank, **options)
            ddp.images, ddp.labels, ddp.shard = trainer.images, trainer.labels, trainer.shard
            return ddp
        parallel_step.make_trainer = make_trainer
     """, "trained on by more than one rank"),
    # Rank 1 trains on rank 0's shard: images 2..3 are skipped.
    ("""
        from pitfalls.families.parallel import step as parallel_step
        real = parallel_step.make_trainer
        def make_trainer(variant, device, config, *, rank=0, **options):
            return real(variant, device, config, rank=0, **options)
        parallel_step.make_trainer = make_trainer
     """, "trained on by no rank"),
])
def test_the_gate_fails_a_rank_on_the_whole_batch_and_one_that_skips_a_shard(tmp_path, monkeypatch, fault, want,
                                                                               no_process_left):
    monkeypatch.setattr(parallel, "DdpGroup", _wrong_group(tmp_path, fault))
    row = FAMILY.compare(DDP, "cpu")
    assert not row.matches and want in row.detail, row


@pytest.mark.slow
def test_the_gate_passes_ddp_on_the_wide_net_whose_state_is_sent_in_parts(no_process_left):
    # Two ranks' weights and momentum of the 25 MiB net in float64: 105 MB each, above the store's 8 MiB message.
    wide = dataclasses.replace(FAMILY, smoke={**FAMILY.smoke, "model": parallel_step.WIDE})
    result = parallel.compare(wide, DDP, CPU)
    assert result.matches, result


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


# --- the step time: one routine, in the ranks -------------------------------------------------------------------


def test_the_step_is_the_slowest_rank_s_median():
    assert step_seconds([[0.010, 0.011, 0.5], [0.030, 0.031, 0.029]]) == pytest.approx(0.030)
    assert step_seconds([[0.02]]) == 0.02
    with pytest.raises(ValueError, match="every rank"):
        step_seconds([[0.01], []])


def test_time_steps_warms_up_waits_at_the_barrier_then_times_synchronized_steps():
    calls = []
    times = time_steps(lambda: calls.append("step"), lambda: calls.append("sync"), 3,
                       barrier=lambda: calls.append("barrier"), warmup=1)
    assert calls == ["step", "sync", "barrier", "step", "sync", "step", "sync", "step", "sync"]
    assert len(times) == 3 and all(t >= 0 for t in times)


def test_a_figure_that_fails_is_n_a_with_its_error_and_the_others_are_measured():
    trainer = make_trainer(SINGLE, CPU, StepConfig(world_size=1, batch=1, image_size=8))

    def hung():
        raise RankFailed("rank(s) [1] did not report 'communication' within 120 s")

    trainer.communication = hung
    case = Case("parallel", SINGLE, CPU, False, {"world_size": 1, "batch": 1, "image_size": 8}, trainer,
                         block=trainer.block)
    figures = parallel.measure_figures(case, steps=2, nvml_seconds=0.1)
    assert figures.communication_s == Unavailable(
        "failed: RankFailed: rank(s) [1] did not report 'communication' within 120 s")
    assert figures.step_s > 0 and figures.samples_per_s == pytest.approx(1 / figures.step_s)
    assert figures.ranks[0].peak_bytes > 0


def test_only_ddp_has_a_step_without_its_communication():
    trainer = make_trainer(SINGLE, CPU, StepConfig(world_size=1, batch=1, image_size=8))
    with pytest.raises(ValueError, match="only a DDP rank"):
        trainer.step_without_communication()
    assert parallel.exposed_communication(trainer, 2) == Unavailable(
        "no DDP all-reduce to leave out: measured for ddp only")


def test_single_times_its_steps_with_the_same_routine(monkeypatch):
    trainer = make_trainer(SINGLE, CPU, StepConfig(world_size=1, batch=1, image_size=8))
    seen = []
    real = parallel_step.time_steps
    monkeypatch.setattr(parallel_step, "time_steps", lambda *a, **k: seen.append(a[2]) or real(*a, **k))
    assert trainer.block(2) > 0 and seen == [2]


@pytest.mark.slow
@pytest.mark.serial
def test_a_rank_group_step_timed_on_rank_0_alone_fails_its_row(monkeypatch, no_process_left):
    # That both rows hold is test_calibrate's (every CPU row of `pitfalls calibrate` passes); here, the fault.
    sleep_check, self_check = parallel_calibration.CHECKS[:2]
    # The mutation: a step time taken from rank 0 alone reads rank 0's 20 ms (and its sleep's overshoot), not 60.
    monkeypatch.setattr(parallel_launch, "step_seconds", lambda per_rank: statistics.median(per_rank[0]))
    row = verdict(sleep_check, sleep_check.measure("cpu"))
    assert row.verdict == "fail" and row.measured < 40, row
    assert sleep_check in FAMILY.calibrations and self_check in FAMILY.calibrations


def _row_named(start: str):
    (check,) = [c for c in parallel_calibration.CHECKS if c.name.startswith(start)]
    assert check in FAMILY.calibrations
    return check


@pytest.mark.serial
def test_exposed_communication_read_as_time_in_flight_fails_its_row(monkeypatch, no_process_left):
    # The mutation: the cost read as the profiler's time in flight, which the wait before the all-reduce is not in.
    check = _row_named("parallel: all-reduce delayed")
    monkeypatch.setattr(DdpGroup, "exposed_communication", lambda group, calls: group.communication())
    row = verdict(check, check.measure("cpu"))
    assert row.verdict == "fail" and row.measured < 0.5 * row.planted, row


@pytest.mark.serial
def test_communication_in_flight_read_on_rank_0_alone_fails_its_row(monkeypatch, no_process_left):
    # The mutation: rank 0's seconds, which hold all of its late peer's 120 ms, instead of the mean over the ranks.
    check = _row_named("parallel: rank 1's all-reduce")

    def rank_0(group: DdpGroup) -> float:
        return float(json.loads(group.run("communication")[0])["seconds"])

    monkeypatch.setattr(DdpGroup, "communication", rank_0)
    row = verdict(check, check.measure("cpu"))
    assert row.verdict == "fail" and row.measured > 1.5 * row.planted, row


# --- the ranks: driven, measured, failing ---------------------------------------------------------------------


def listening(pids):
    """(address, port) of every TCP socket the processes listen on."""
    found = []
    for pid in pids:
        for connection in psutil.Process(pid).net_connections(kind="tcp"):
            if connection.status == psutil.CONN_LISTEN:
                found.append((connection.laddr.ip, connection.laddr.port))
    return found


@pytest.mark.slow
def test_nothing_a_running_group_opened_listens_beyond_loopback(no_process_left):
    before = set(listening([os.getpid()]))
    case = FAMILY.build(DDP, device="cpu", world_size=2, batch=1, image_size=8)
    try:
        group = case.call
        case()  # the process group and DDP's gloo sockets are up
        opened = sorted(set(listening([os.getpid(), *group.rank_pids])) - before)
        assert (LOOPBACK, group.port) in opened
        assert [a for a in opened if a[0] not in ("127.0.0.1", "::1")] == [], opened
    finally:
        case.close()


@pytest.mark.slow
def test_the_control_store_listens_on_loopback_and_wants_the_run_s_secret(no_process_left):
    store = loopback_store(5)
    assert [a for a in listening([os.getpid()]) if a[1] == store.port] == [(LOOPBACK, store.port)]
    del store
    group = DdpGroup(StepConfig(world_size=1, batch=1, image_size=8), "cpu")
    try:
        # Another local client that finds the port, without the secret, writes commands nobody reads.
        intruder = TCPStore(LOOPBACK, group.port, is_master=False, timeout=datetime.timedelta(seconds=5))
        intruder.set("cmd/1", "stop")
        intruder.set("/cmd/1", "stop")
        assert math.isfinite(group())
        assert "PITFALLS_GROUP_SECRET" not in " ".join(psutil.Process(group.rank_pids[0]).cmdline())
    finally:
        group.close()


@pytest.mark.slow
def test_a_ddp_case_times_steps_in_its_ranks_that_stay_alive_and_measures_each_rank(no_process_left):
    case = FAMILY.build(DDP, device="cpu", world_size=2, batch=2, image_size=16)
    try:
        group = case.call
        pids = list(group.rank_pids)
        assert len(pids) == 2 and os.getpid() not in pids
        losses = [case() for _ in range(3)]
        assert all(math.isfinite(loss) for loss in losses) and losses[2] < losses[0]  # it trains
        times = group.times(3)
        assert len(times) == 2 and all(len(t) == 3 for t in times)
        assert case.block is not None and case.block(2) > 0
        assert alive(pids) == pids  # the same two processes served every command
        ranks = group.measure()
        assert [r.rank for r in ranks] == [0, 1] and {r.pid for r in ranks} == set(pids)
        assert all(r.memory == parallel_step.STEP_PEAK and r.peak_bytes > 0 and r.seconds > 0 for r in ranks)
        communication = group.communication()
        assert isinstance(communication, float) and communication > 0
        blocks: list[float] = []
        timed = group.block
        group.block = lambda calls: blocks.append(timed(calls)) or blocks[-1]  # keeps each block the figures time
        figures = parallel.measure_figures(case, steps=3, nvml_seconds=0.1)
        assert figures.step_s == blocks[0] and figures.samples_per_s == pytest.approx(4 / figures.step_s)
        assert len(figures.ranks) == 2 and 0.5 < figures.memory_imbalance() < 2  # the same step on both ranks
        assert figures.busy_pct == Unavailable("case runs on cpu: no GPU for NVML to read")
        # Exposed communication: its own block of synced steps minus a block under no_sync(), which takes time;
        # it may read below 0 in noise. Blocks timed apart on a shared machine differ, so it is held to its own.
        assert len(blocks) == 2 and math.isfinite(figures.exposed_communication_s)
        assert figures.exposed_communication_s < blocks[1]
    finally:
        case.close()
    assert alive(pids) == []


@pytest.mark.slow
def test_a_rank_that_raises_ends_the_run_with_its_traceback_and_leaves_nothing(tmp_path, no_process_left):
    entry = rank_script(tmp_path, """
        import os
        from pitfalls.families.parallel import rank as parallel_rank
        real = parallel_rank.COMMANDS["step"]
        def step(trainer, argument):
            if os.environ["RANK"] == "1":
                raise RuntimeError("rank 1 was told to fail")
            return real(trainer, argument)
        parallel_rank.COMMANDS["step"] = step
    """)
    # The step timeout is long: the run must end because of the error, not because nothing answered.
    group = DdpGroup(StepConfig(world_size=2, batch=1, image_size=8), "cpu", entry=entry, step_timeout_s=300)
    pids = list(group.rank_pids)
    with pytest.raises(RankFailed) as failure:
        group()
    message = str(failure.value)
    assert message.startswith("rank 1 (")
    assert "Traceback (most recent call last)" in message and "RuntimeError: rank 1 was told to fail" in message
    assert "did not report" not in message
    assert alive(pids) == []
    with pytest.raises(RankFailed, match="closed"):
        group()


@pytest.mark.slow
def test_a_hung_rank_ends_as_rank_failed_with_its_stack(tmp_path, no_process_left):
    entry = rank_script(tmp_path, """
        import os, time
        from pitfalls.families.parallel import rank as parallel_rank
        real = parallel_rank.COMMANDS["step"]
        def hang_here_forever():
            while True:
                time.sleep(1)
        def step(trainer, argument):
            if os.environ["RANK"] == "1":
                hang_here_forever()
            return real(trainer, argument)
        parallel_rank.COMMANDS["step"] = step
    """)
    group = DdpGroup(StepConfig(world_size=2, batch=1, image_size=8), "cpu", entry=entry, step_timeout_s=5)
    pids = list(group.rank_pids)
    with pytest.raises(RankFailed) as failure:
        group()
    message = str(failure.value)
    # Rank 0 waits in the step's all-reduce for rank 1: neither answers, and rank 1's stack shows where it hangs.
    assert "rank(s) [0, 1] did not report 'step' within 5 s" in message
    assert "--- rank 1 output" in message and "hang_here_forever" in message
    assert alive(pids) == []


@pytest.mark.slow
def test_the_gate_fails_a_variant_whose_rank_raises(tmp_path, monkeypatch, no_process_left):
    monkeypatch.setattr(parallel, "DdpGroup", _wrong_group(tmp_path, """
        import os
        from pitfalls.families.parallel import rank as parallel_rank
        def step(trainer, argument):
            raise RuntimeError(f"rank {os.environ['RANK']} cannot step")
        parallel_rank.COMMANDS["step"] = step
    """))
    row = FAMILY.compare(DDP, "cpu")
    assert not row.matches and row.max_abs_diff == math.inf
    # Both ranks raise; which failure the group names first is a race: a rank's traceback, or the other rank's
    # exit that reached the launcher before it ("rank 1 (pid N) exited with code 1", seen in 2 of 3 clean-clone runs).
    assert row.detail.startswith("rank "), row.detail
    assert row.detail.endswith("cannot step") or re.search(r"rank \d \(pid \d+\) exited with code 1$", row.detail), \
        row.detail


@pytest.mark.slow
def test_a_rank_that_fails_while_starting_is_reported(tmp_path, no_process_left):
    entry = rank_script(tmp_path, """
        import os
        from pitfalls.families.parallel import rank as parallel_rank
        if os.environ["RANK"] == "0":
            parallel_rank.init_rank = lambda args: (_ for _ in ()).throw(ValueError("no such device here"))
    """)
    with pytest.raises(RankFailed, match=r"(?s)rank 0 \(.*ValueError: no such device here"):
        DdpGroup(StepConfig(world_size=2, batch=1, image_size=8), "cpu", entry=entry)


@pytest.mark.slow
def test_a_rank_killed_without_a_word_is_reported_with_its_exit(no_process_left):
    group = DdpGroup(StepConfig(world_size=2, batch=1, image_size=8), "cpu", step_timeout_s=300)
    killed = group.rank_pids[1]
    os.kill(killed, signal.SIGKILL)
    with pytest.raises(RankFailed) as failure:
        group()
    message = str(failure.value)
    assert f"rank 1 (pid {killed}) was killed by SIGKILL" in message and "did not report" not in message
    assert alive(group.rank_pids) == []


@pytest.mark.slow
def test_ranks_exit_when_the_process_driving_them_dies(tmp_path):
    # asv's benchmark processes may end without closing anything: the ranks must not outlive them.
    script = textwrap.dedent("""
        import json, os, sys
        from pitfalls.families.parallel.step import StepConfig
        from pitfalls.families.parallel.launch import DdpGroup
        group = DdpGroup(StepConfig(world_size=2, batch=1, image_size=8), "cpu")
        group()
        print(json.dumps(group.rank_pids), flush=True)
        os._exit(0)  # no close, no atexit, no finalizer
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    pids = json.loads(done.stdout.strip().splitlines()[-1])
    deadline = time.monotonic() + 150
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
    assert "parallel/ddp world_size=2 batch=2 image_size=16 model=segnet cpu eager" in out
    assert "speedup over single" in out and "does not apply to the parallel family" in out
    # The command does not close its cases; the group's finalizer stops the ranks when the interpreter exits.
    ranks = []
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if process.environ().get("PITFALLS_GROUP_LAUNCHER") == str(probe.pid):
                ranks.append(process.pid)
    assert alive(ranks) == []


@pytest.mark.slow
def test_two_nodes_each_with_its_own_torchrun_write_their_ranks_and_one_summary(tmp_path, no_process_left):
    # Two torchrun commands as on two machines, here both on 127.0.0.1: c10d rendezvous, one rank per node.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
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


def test_the_rank_module_refuses_a_negative_planted_wait_on_one_line(capsys) -> None:
    from pitfalls.families.parallel import rank as parallel_rank

    with pytest.raises(SystemExit) as stopped:
        parallel_rank.parse_args(["--out", "unused", "--plant-comm-ms", "-5"])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith("--plant-comm-ms=-5 is not allowed; it must be >= 0")


MEMORY_ROWS = [c for c in parallel_calibration.CHECKS if "MiB" in c.name]
# A rank's memory read as its whole USS (libtorch included), as the figure once was.
WHOLE_USS_RANK = """
import os, socket, time
import psutil
from pitfalls.families.parallel import step as parallel_step

def whole_uss(self):
    start = time.perf_counter()
    self.step()
    return [parallel_step.RankFigures(self.rank, socket.gethostname(), os.getpid(), "cpu",
                                      time.perf_counter() - start, psutil.Process().memory_full_info().uss, "USS")]

parallel_step.Trainer.measure = whole_uss
"""


@pytest.mark.slow
@pytest.mark.serial
def test_a_rank_s_whole_memory_read_as_its_step_s_fails_the_memory_rows(tmp_path, no_process_left):
    figures = parallel_calibration.held_memory_figures(entry=rank_script(tmp_path, WHOLE_USS_RANK))
    rows = [verdict(check, check.measure("cpu", figures=lambda: figures)) for check in MEMORY_ROWS]
    # Each rank's libtorch and interpreter are in its USS: hundreds of MiB over the planted 96 and 32, and a
    # ratio near 1, whatever the step holds.
    assert [row.verdict for row in rows] == ["fail"] * 3, rows
    assert rows[0].measured > 2 * rows[0].planted and abs(rows[2].measured - 1) < 0.5, rows


@pytest.mark.slow
@pytest.mark.serial
def test_rank_0_s_memory_read_for_every_rank_fails_the_others_and_imbalance_rows(no_process_left):
    # The group the rows read (one per process), with rank 0's figures in every rank's place.
    figures = parallel_calibration.HELD_MEMORY.take("rank 0 for every rank")
    rank_0 = dataclasses.replace(figures, ranks=(figures.ranks[0],) * len(figures.ranks))
    rows = [verdict(check, check.measure("cpu", figures=lambda: rank_0)) for check in MEMORY_ROWS]
    assert [row.verdict for row in rows] == ["pass", "fail", "fail"], rows


def test_the_memory_rows_are_the_family_s_and_read_the_figures_it_publishes():
    published = {name for name in FAMILY.benchmark_figures.values()}
    for check in MEMORY_ROWS:
        assert check in FAMILY.calibrations
        (instrument,) = check.instruments
        assert instrument.removeprefix("parallel: ") in published



def test_the_allocator_s_peak_is_the_largest_running_sum_of_allocations_and_frees_in_time_order():
    def event(start, held):
        return SimpleNamespace(time_range=SimpleNamespace(start=start), self_cpu_memory_usage=held)

    # Listed out of order, as a profiler's nested events are: in time order the running sum is 4, 10, 3, 5.
    events = [event(3, 2), event(0, 4), event(2, -7), event(1, 6), event(4, 0)]
    assert parallel_step.allocated_peak(events) == 10
    assert parallel_step.allocated_peak([event(0, -5)]) == 0  # a free of what the window did not allocate


def test_a_step_s_memory_on_the_cpu_grows_by_exactly_what_its_forward_holds():
    trainer = make_trainer(SINGLE, CPU, StepConfig(world_size=1, batch=2, image_size=16))
    trainer.step()  # the gradients and momentum buffers, allocated once
    [plain] = trainer.measure()
    trainer.forward = parallel_step.HeldInForward(trainer.forward, 8 << 20)
    [holding] = trainer.measure()
    # Not to the byte: an op's own allocations count at its start, net of its own frees, so the order of a few
    # small ones around the high point moves it by a few KiB (3.5 KiB in one run).
    assert plain.peak_bytes > 0 and holding.peak_bytes - plain.peak_bytes == pytest.approx(8 << 20, abs=64 << 10)


@pytest.mark.slow
@pytest.mark.serial
def test_weak_scaling_from_rank_0_s_step_alone_fails_its_row(monkeypatch, no_process_left):
    check = _row_named("parallel: 2 ranks at half the pace")
    # The mutation: the pair's step read on rank 0, which sleeps as long as the lone rank: it reads perfect scaling.
    monkeypatch.setattr(parallel_launch, "step_seconds", lambda per_rank: statistics.median(per_rank[0]))
    row = verdict(check, check.measure("cpu"))
    assert row.verdict == "fail" and row.measured > 0.9, row
    assert FAMILY.benchmark_figures["track_scaling_efficiency"] == parallel_calibration.SCALING_FIGURE

"""The GPU path's rules of `pitfalls doctor`, read from the planted script written for CUDA (run under --cuda-on-cpu)
and from small scripts: DDP's all-reduces that no_sync would skip (and those a no_sync around the backward alone does
not), GradScaler's syncs and a GradScaler with bfloat16, a search for unused parameters that finds none,
DataParallel, and the settings left on from debugging. Every test also runs on PyPI's CUDA build."""

from __future__ import annotations

import contextlib
import inspect
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from pitfalls.doctor import DoctorOptions, ScriptLine, checks, planted, run_doctor
from pitfalls.doctor.report import DoctorReport, Finding
from pitfalls.doctor.rules import settings, syncs, training
from pitfalls.doctor.training_watch import TrainingWatch
from pitfalls.known.table import CPU
from pitfalls.probes import rewrites
from pitfalls.probes.hostcopy import Provenance, keep_provenance
from pitfalls.probes.sites import HazardLocator

pytestmark = pytest.mark.cuda_build  # also in the test command's CUDA-build leg

SCRIPT = planted.GPU_PATH


@pytest.fixture(scope="module")
def report() -> DoctorReport:
    return checks.run_script(str(SCRIPT), (), CPU)


def at(report: DoctorReport, rule_name: str, text: str) -> list[Finding]:
    return [f for f in report.findings if f.rule == rule_name and f.line == ScriptLine(SCRIPT, text).number]


def sync_rule(hazard: rewrites.HazardClass) -> str:
    (rule,) = [r for r in syncs.RULES if r.name == hazard.name]
    return rule.name


def test_the_gpu_path_ran_on_the_cpu_under_the_mapping(report):
    assert report.failure is None and report.steps.scanned == 5 and report.steps.gpu == 0
    calls = dict(report.cuda_on_cpu.calls)
    assert calls["nccl -> gloo"] == 1 and calls["DDP device_ids"] == 4 and calls["DataParallel device_ids"] == 1
    assert not dist.is_initialized()  # the script's own finally destroyed its group


def test_accumulating_four_micro_batches_without_no_sync_reads_three_skippable_all_reduces_a_step(report):
    (found,) = at(report, training.ACCUMULATION.name, "accumulated_loss = accumulated(x[micro])")
    assert found.per_step == 3.0 and found.title.startswith("4 all-reduces a step")
    assert at(report, training.ACCUMULATION.name, "synced_loss = synced(x[micro])") == []  # no_sync: one a step


def test_no_sync_around_the_backward_alone_reads_its_all_reduces_as_run_anyway(report):
    (found,) = at(report, training.NO_SYNC_BACKWARD.name, "outside = misplaced(x[micro])")
    assert found.per_step == 3.0 and "outside no_sync()" in found.title
    # Its last micro-batch, outside no_sync, is the one all-reduce a step that is needed: no accumulation finding.
    assert at(report, training.ACCUMULATION.name, "outside = misplaced(x[micro])") == []


def test_gradscalers_inf_check_is_one_sync_a_step_at_scaler_step_and_no_scalar_read_of_the_line(report):
    (found,) = at(report, sync_rule(rewrites.INF_CHECK), "scaler.step(slow)")
    assert (found.kind, found.per_step, found.title) == ("sync", 1.0, ".item() of GradScaler's found_inf")
    assert "fused=True" in found.fix
    assert at(report, sync_rule(rewrites.SCALAR), "scaler.step(slow)") == []  # read once, with GradScaler's fix
    assert [f for f in report.findings if f.line == ScriptLine(SCRIPT, "scaler.step(fused)").number] == []
    (scale,) = at(report, sync_rule(rewrites.GET_SCALE), "current = scaler.get_scale()")
    assert scale.per_step == 1.0


def test_a_search_for_unused_parameters_that_finds_none_is_read_at_the_wrapper(report):
    (found,) = at(report, training.FIND_UNUSED.name, "accumulated = DistributedDataParallel(")
    # Four armed forwards a step, each a search; every one of the 20 scanned backwards used every parameter.
    assert found.per_step == 4.0 and "each of 20 backward(s)" in found.title
    assert at(report, training.FIND_UNUSED.name, "branchy = DistributedDataParallel(") == []


def test_dataparallel_and_a_gradscaler_with_bfloat16_are_read_at_their_lines(report):
    (parallel,) = at(report, training.DATA_PARALLEL.name, "parallel = nn.DataParallel(")
    assert parallel.title == "nn.DataParallel of Linear" and parallel.per_step is None
    (scaler,) = at(report, training.BF16_SCALER.name, "brain_scaler.scale(brain_loss).backward()")
    assert scaler.per_step == 1.0
    assert at(report, training.BF16_SCALER.name, "scaler.scale(half_loss).backward()") == []


@pytest.mark.parametrize(("rule", "planted_text"), [
    (settings.ANOMALY, "torch.autograd.set_detect_anomaly(True)"),
    (settings.PROFILER, "profiler.start()"),
    (settings.DETERMINISTIC, "torch.use_deterministic_algorithms(True)"),
    (settings.LAUNCH_BLOCKING, 'os.environ["CUDA_LAUNCH_BLOCKING"] = "1"'),
])
def test_each_setting_left_on_is_read_at_the_scripts_call_that_turned_it_on(report, rule, planted_text):
    (found,) = [f for f in report.findings if f.rule == rule.name]
    assert found.line == ScriptLine(SCRIPT, planted_text).number and "(set here)" in found.title


def test_the_script_put_every_setting_back(report):
    assert report.failure is None
    assert not torch.is_anomaly_enabled() and not torch.are_deterministic_algorithms_enabled()
    assert not torch._C._autograd._profiler_enabled() and not torch.backends.cudnn.benchmark


STEPS = """
import sys
import torch

conv = torch.nn.Conv2d(3, 4, 3)
optimizer = torch.optim.SGD(conv.parameters(), lr=0.1)
size = 8
while True:
    size = size + 1 if sys.argv[1] == "growing" else size
    conv(torch.randn(2, 3, size, size)).sum().backward()
    optimizer.step()
"""


def _steps(tmp_path: Path, shapes: str) -> DoctorReport:
    script = tmp_path / "steps.py"
    script.write_text(STEPS)
    return run_doctor(script, (shapes,), DoctorOptions(warmup=1, steps=1, scanned=5, memory=1))


def test_a_setting_from_the_environment_is_read_at_the_line_that_ended_the_first_step(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_LAUNCH_BLOCKING", "1")
    found = _steps(tmp_path, "fixed")
    (blocking,) = [f for f in found.findings if f.rule == settings.LAUNCH_BLOCKING.name]
    assert blocking.code == "optimizer.step()" and "set outside the script" in blocking.title
    # The doctor's own anomaly mode (the hazard counter's) is not the script's: no anomaly finding.
    assert [f.rule for f in found.findings if f.rule in {r.name for r in settings.RULES[:3]}] == []


@pytest.mark.parametrize(("shapes", "found"), [("fixed", 1), ("growing", 0)])
def test_cudnn_benchmark_off_is_read_only_where_every_convolution_keeps_its_shapes(tmp_path, shapes, found):
    report = _steps(tmp_path, shapes)
    benchmark = [f for f in report.findings if f.rule == settings.CUDNN_BENCHMARK.name]
    assert len(benchmark) == found
    assert all(f.code.startswith("conv(torch.randn") and f.per_step == 1.0 for f in benchmark)


def _amp_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler) -> None:
    with torch.autocast("cpu", dtype=torch.float16):
        loss = model(torch.randn(8, 8)).float().square().mean()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    loss.item()
    scaler.get_scale()


def _line_of(text: str) -> int:
    lines, first = inspect.getsourcelines(_amp_step)
    (found,) = [first + n for n, line in enumerate(lines) if text in line]
    return found


@pytest.mark.parametrize("fused", [False, True])
def test_gradscalers_reads_are_classes_of_their_own_and_a_fused_optimizer_has_none(fused):
    model = torch.nn.Linear(8, 8)
    optimizer, scaler = torch.optim.AdamW(model.parameters(), fused=fused), torch.amp.GradScaler("cpu")
    provenance = Provenance()
    with keep_provenance(provenance):  # the optimizer's state made on the host, as the doctor's first step keeps it
        _amp_step(model, optimizer, scaler)
    with HazardLocator(provenance=provenance) as locator:
        _amp_step(model, optimizer, scaler)
    found = {(site.line.lineno, site.kind.hazard): site.count for site in locator.result.sites}
    expected = {(_line_of("loss.item()"), rewrites.SCALAR): 1, (_line_of("scaler.get_scale()"), rewrites.GET_SCALE): 1}
    if not fused:  # GradScaler.step reads found_inf for an optimizer without _step_supports_amp_scaling
        expected[(_line_of("scaler.step(optimizer)"), rewrites.INF_CHECK)] = 1
    assert found == expected


@pytest.fixture
def one_rank():
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_ddps_reads_of_its_host_side_map_of_used_parameters_are_no_hazard_and_a_hooks_own_read_is(one_rank):
    # find_unused_parameters=True: the reducer reads its map of used parameters, kept in host memory, with .item()
    # a parameter at a time (reducer.cpp's finalize_bucket_dense), and one more for the unused one: no sync.
    class Branchy(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.used, self.unused = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.used(x)

    model = DistributedDataParallel(Branchy(), find_unused_parameters=True)
    model(torch.randn(2, 4)).sum().backward()  # the first backward builds the buckets
    with HazardLocator() as locator:
        model(torch.randn(2, 4)).sum().backward()
    assert locator.result.sites == () and locator.result.total == 0
    # A hook of the script's own that reads a device value is still its sync, at the hook's line.
    weight = model.module.used.weight
    read: list[float] = []
    handle = weight.register_post_accumulate_grad_hook(lambda p: read.append(p.grad.sum().item()))
    try:
        with HazardLocator() as located:
            model(torch.randn(2, 4)).sum().backward()
    finally:
        handle.remove()
    (site,) = located.result.sites
    assert site.kind.hazard is rewrites.SCALAR and "register_post_accumulate_grad_hook" in site.line.code
    assert len(read) == 1


@pytest.mark.parametrize(("around", "reduced", "in_no_sync"), [
    ("nothing", 4, 0), ("forward and backward", 0, 0), ("backward", 4, 4), ("forward", 0, 0)])
def test_the_watch_reads_the_all_reduces_ddp_runs_as_its_comm_hook_counts_them(one_rank, around, reduced, in_no_sync):
    # torch's own count: the comm hook runs once a bucket all-reduce. A no_sync around the backward alone skips none
    # (the reducer was armed at the forward); one around the forward alone skips them all.
    model = DistributedDataParallel(torch.nn.Linear(4, 4))
    hooked: list[int] = []

    def hook(_state, bucket):  # noqa: ANN001, ANN202 (DDP refuses a bucket annotation that is a string)
        hooked.append(1)
        done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        done.set_result(bucket.buffer())
        return done

    model.register_comm_hook(None, hook)
    with TrainingWatch() as watch:
        for _ in range(4):
            with model.no_sync() if around in ("forward and backward", "forward") else contextlib.nullcontext():
                out = model(torch.randn(2, 4)).sum()
            with model.no_sync() if around in ("forward and backward", "backward") else contextlib.nullcontext():
                out.backward()
    (seen,) = watch.ddp.values()
    assert len(hooked) == reduced == sum(f.backward for f in seen.armed)
    assert sum(f.in_no_sync for f in seen.armed) == in_no_sync

"""`pitfalls doctor --cuda-on-cpu`: scripts written for CUDA (tests/doctor_cuda/) run on this CPU, taking their GPU
path, and read as they would on a GPU; without the flag they get a hint; an unmapped call is one line; everything
is restored after. Every test also runs on PyPI's CUDA build, which finds no driver here."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from pitfalls import cli
from pitfalls.doctor import DoctorOptions, run_doctor
from pitfalls.doctor import cuda_on_cpu as mapping
from pitfalls.doctor.reasons import NO_GPU
from pitfalls.probes.hostcopy import Provenance
from pitfalls.probes.syncs import SyncHazardCounter

pytestmark = pytest.mark.cuda_build  # also in the test command's CUDA-build leg

SCRIPTS = Path(__file__).resolve().parent / "doctor_cuda"
MAPPED = DoctorOptions(warmup=2, steps=3, scanned=5, memory=1, cuda_on_cpu=True)


def line_of(path: Path, text: str) -> int:
    found = [n for n, line in enumerate(path.read_text().splitlines(), start=1) if text in line]
    assert len(found) == 1, (text, found)
    return found[0]


def syncs(report) -> dict[tuple[int, str], float]:
    return {(f.line, f.title): f.per_step for f in report.findings if f.kind == "sync"}


def test_an_amp_loop_reads_gradscalers_item_at_its_step_and_its_batches_copied_from_pinned_memory():
    path = SCRIPTS / "amp_train.py"
    report = run_doctor(path, (), MAPPED)
    assert report.failure is None and report.steps.scanned == 5 and report.steps.total == 12
    # GradScaler._maybe_opt_step reads found_inf with .item() for an optimizer that is not fused: 1 a step, at the
    # script's scaler.step line, GradScaler's inf check and not a scalar read of the line's own; nothing else syncs
    # (the batches' copies do not wait).
    assert syncs(report) == {(line_of(path, "scaler.step(optimizer)"), ".item() of GradScaler's found_inf"): 1.0}
    (check,) = [f for f in report.findings if f.kind == "sync"]
    assert check.rule == "GradScaler's inf check" and "fused=True" in check.fix
    copies = {(c.line, c.pinned, c.blocking, c.per_step) for c in report.copies}
    assert copies == {(line_of(path, "features = features.to(device, non_blocking=True)"), True, False, 1.0),
                      (line_of(path, "labels = labels.to(device, non_blocking=True)"), True, False, 1.0)}
    # autocast("cuda", float16) casts on the CPU: the half-precision rule reads the script's float16 matmuls.
    (half,) = [f for f in report.findings if f.rule == "half-precision size not a multiple of 8"]
    assert half.line == line_of(path, "logits = model(features)") and "float16" in half.title
    calls = dict(report.cuda_on_cpu.calls)
    # The model's 4 tensors once, then the step's 2 batch tensors; an autocast region a step; one GradScaler.
    assert calls == {mapping.MOVED: 4 + 2 * 12, mapping.AUTOCAST: 12, mapping.SCALER: 1}
    # The doctor's own questions about CUDA got the real answers: no GPU phase, the process group's memory.
    assert report.steps.gpu == 0 and report.no_gpu == NO_GPU and report.memory.source == "process group"


def test_a_fused_adamw_takes_the_inf_check_on_the_device_and_reads_no_sync():
    # torch 2.13's CPU build runs AdamW(fused=True), which has _step_supports_amp_scaling: GradScaler hands it
    # found_inf and reads no .item().
    report = run_doctor(SCRIPTS / "amp_train.py", ("--fused",), MAPPED)
    assert report.failure is None and report.steps.scanned == 5
    assert syncs(report) == {}
    assert dict(report.cuda_on_cpu.calls)[mapping.SCALER] == 1


@pytest.fixture
def one_rank(monkeypatch):
    """torchrun's variables for one process of one rank, on a free loopback port."""
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(name, value)


def test_a_ddp_script_run_as_one_rank_reads_its_two_blocking_batch_copies_and_nothing_else(one_rank):
    path = SCRIPTS / "ddp_train.py"
    # No ranks given: the doctor meets no other rank, while the script reads torchrun's variables from os.environ.
    report = run_doctor(path, ("5",), MAPPED)
    assert report.failure is None and report.steps.scanned == 5
    source, targets = line_of(path, "source = source.to(gpu)"), line_of(path, "targets = targets.to(gpu)")
    found = [f for f in report.findings if f.kind == "sync"]
    assert {(f.line, f.per_step) for f in found} == {(source, 1.0), (targets, 1.0)}
    assert all("pinned memory" in f.fix and "non_blocking=True" in f.fix for f in found)
    assert {(c.line, c.pinned, c.blocking) for c in report.copies} == {(source, True, True), (targets, True, True)}
    calls = dict(report.cuda_on_cpu.calls)
    assert (calls[mapping.SET_DEVICE], calls[mapping.NCCL], calls[mapping.DDP]) == (1, 1, 1)
    assert calls[mapping.MOVED] == 2 + 2 * 12  # .to(gpu) of the model's 2 tensors, then 2 a step
    assert not dist.is_initialized()  # the group the stopped script left is destroyed with the mapping


@pytest.mark.parametrize("workers", [0, 2])
def test_torch_cuda_and_torch_accelerator_answer_as_one_gpu_and_every_mapped_call_works(workers):
    # The script checks each answer itself and raises at the first that is not a GPU's; its collate function moves
    # each batch to the GPU, in the loader's own work (workers=0, where the instruments are popped) or in workers
    # forked under the mapping.
    report = run_doctor(SCRIPTS / "many_calls.py", (str(workers),), MAPPED)
    assert report.failure is None and report.steps.total == 12
    calls = dict(report.cuda_on_cpu.calls)
    assert {mapping.QUERIES, mapping.SET_DEVICE, mapping.SYNCHRONIZE, mapping.STREAMS, mapping.NVTX,
            mapping.AUTOCAST, mapping.SCALER, mapping.DATA_PARALLEL, mapping.LOAD, mapping.DEFAULT_DEVICE} <= set(calls)
    # The model's 2 tensors; with no workers, each step's batch moved by the collate function in this process too.
    assert calls[mapping.MOVED] == 2 + (12 if workers == 0 else 0)
    assert (report.cuda_on_cpu.device, report.cuda_on_cpu.devices) == (mapping.DEVICE_NAME, 1)


def test_compiled_code_maps_its_cuda_calls_without_a_graph_break_or_a_recompile():
    path = SCRIPTS / "compiled_step.py"
    report = run_doctor(path, (), MAPPED)
    assert report.failure is None and report.steps.scanned == 5
    assert report.compile.graph_breaks == () and report.compile.recompiles == ()
    # The noise made on "cuda" is device data; the input filled on the host and moved is a copy to make there.
    assert {line for line, _title in syncs(report)} == {line_of(path, 'features = features.to("cuda")'),
                                                        line_of(path, "labels = torch.randint(0, 4, (8,)).cuda()")}


def test_moves_by_index_by_device_and_by_cuda_read_as_copies_to_the_device_and_pinned_memory_is_marked():
    provenance = Provenance()
    with mapping.CudaOnCpu(provenance) as mapped, SyncHazardCounter(provenance=provenance) as counter:
        host = torch.ones(4)
        provenance.add(host)
        moved = [host.to(0), host.to(torch.device("cuda", 0)), host.cuda(), host.to("cuda", non_blocking=True)]
        on_device = torch.zeros(4, device="cuda")
        on_device.sum().item()
        pinned, buffer = host.pin_memory(), torch.empty(4, pin_memory=True)
        assert pinned.is_pinned() and buffer.is_pinned() and not host.is_pinned()
        with pytest.raises(RuntimeError, match="invalid device ordinal"):
            torch.cuda.set_device(1)  # one device: LOCAL_WORLD_SIZE is not set
    assert counter.result.as_dict() == {"Tensor.to (host to device)": 2, "Tensor.cuda (host to device)": 1,
                                        "aten._local_scalar_dense.default": 1}
    assert all(t.device.type == "cpu" and t is not host for t in moved)  # each a copy on the CPU
    assert mapped.calls == {mapping.MOVED: 4, mapping.MADE: 1, mapping.PINNED: 2, mapping.SET_DEVICE: 1}


def test_without_the_flag_a_cuda_script_fails_at_its_first_cuda_call_with_the_hint(tmp_path):
    done = subprocess.run([sys.executable, "-m", "pitfalls", "doctor", str(SCRIPTS / "amp_train.py")],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    lines = done.stdout.splitlines()
    (failed,) = [n for n, line in enumerate(lines) if line.startswith("the script failed before its first step")]
    assert any(sign in " ".join(lines[failed:failed + 2]) for sign in mapping.NEEDS_CUDA)
    (hint,) = [line for line in lines if line.startswith("hint:")]
    assert "--cuda-on-cpu" in hint


def test_an_error_that_is_not_cudas_gets_no_hint(capsys, monkeypatch):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert cli.main(["doctor", "--json", str(SCRIPTS / "ddp_train.py"), "--", "1"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["error"] == {"last_line": "KeyError: 'LOCAL_RANK'", "step": 0, "hint": None}
    assert data["cuda_on_cpu"] is None


def test_a_cuda_call_the_mapping_does_not_cover_stops_the_run_with_one_line(capsys):
    path = SCRIPTS / "graphed.py"
    assert cli.main(["doctor", "--cuda-on-cpu", "--json", str(path)]) == 1
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    last = data["error"]["last_line"]
    assert f"graphed.py:{line_of(path, 'torch.cuda.CUDAGraph()')} is not mapped onto the CPU" in last
    assert "CUDAGraph" in last.split(" at ")[0] and "\n" not in last
    assert "Traceback" not in captured.err  # no traceback, the doctor's or torch's
    assert data["cuda_on_cpu"]["calls"] == {mapping.MOVED: 2, mapping.MADE: 1}


def test_everything_is_restored_after_the_run_and_a_run_without_the_flag_is_as_before():
    from torch.amp import autocast_mode, grad_scaler
    from torch.nn.parallel import DataParallel, DistributedDataParallel
    from torch.utils._device import DeviceContext

    unmapped = DoctorOptions(warmup=1, steps=1, scanned=1, memory=1)
    first = run_doctor(SCRIPTS / "amp_train.py", (), unmapped)  # torch's own lazy imports done before the snapshot
    owners = (torch.cuda, torch.cuda.nvtx, torch.accelerator, dist, dist.distributed_c10d, DistributedDataParallel,
              DataParallel, autocast_mode.autocast, grad_scaler.GradScaler, torch, torch.serialization,
              DeviceContext, torch.nn.Module)
    before = [dict(vars(owner)) for owner in owners]
    available = torch.cuda.is_available()
    report = run_doctor(SCRIPTS / "many_calls.py", ("0",), MAPPED)
    assert report.failure is None and report.cuda_on_cpu.calls
    for owner, saved in zip(owners, before, strict=True):
        changed = [name for name, value in saved.items() if vars(owner).get(name) is not value]
        assert changed == [], (owner, changed)
    assert torch.cuda.is_available() == available and torch._C._len_torch_function_stack() == 0
    again = run_doctor(SCRIPTS / "amp_train.py", (), unmapped)
    assert again.cuda_on_cpu is None and again.failure is not None and again.failure.hint == mapping.HINT
    assert again.failure.last_line == first.failure.last_line

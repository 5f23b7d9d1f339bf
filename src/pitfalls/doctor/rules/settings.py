"""Settings that slow every step, left on from debugging (read at the first step's end by `setup_watch.SetupWatch`)
or never turned on (cuDNN's benchmark, read at each convolution by the model's watch); docs/doctor.md, "The GPU path's
rules".
"""

from __future__ import annotations

from collections.abc import Callable

from pitfalls.doctor import setup_watch
from pitfalls.doctor.planted import GPU_PATH
from pitfalls.doctor.records import Seen
from pitfalls.doctor.rule import Hit, Plant, Rule
from pitfalls.doctor.rules import model
from pitfalls.doctor.setup_watch import SetupWatch
from pitfalls.probes.sites import source_line

__all__ = ["ANOMALY", "CUDNN_BENCHMARK", "DETERMINISTIC", "LAUNCH_BLOCKING", "PROFILER", "RULES"]

_READS = "the setup watch: the setting at the first step's end, and the script's call that turned it on"


def _left_on(setting: str) -> Callable[[Seen], list[Hit]]:
    def find(seen: Seen) -> list[Hit]:
        found = seen.watched(SetupWatch)
        if setting not in found.left_on:
            return []
        line = found.left_on[setting]
        where = "set here" if line is not None else "set outside the script: at the line that ended the first step"
        return [Hit(f"{setting} on at the first step's end ({where})", line or found.first_step, None)]

    return find


def _untuned(seen: Seen) -> list[Hit]:
    watch, steps = seen.scanned(model.watch)
    if watch is None:
        return []
    untuned = watch.untuned
    # Each shape ran in every scanned step (as often as the steps, at least): benchmark would time it once.
    if not untuned or any(n < steps for shapes in untuned.values() for n in shapes.values()):
        return []
    key = max(untuned, key=lambda line: sum(untuned[line].values()))
    total = sum(n for shapes in untuned.values() for n in shapes.values())
    return [Hit(f"{total / steps:g} convolution(s) a step at {len(untuned)} line(s) with cudnn.benchmark off, each "
                "shape the same every step", source_line(key), total / steps)]


def _setting(name: str, finds: str, fix: str, source: str, plant: tuple[str, str], where: str) -> Rule:
    return Rule(name, "rule", finds, fix, source, _READS, _left_on(name), Plant.of(GPU_PATH, *plant), where=where,
                gated=True, watch=SetupWatch)


ANOMALY = _setting(
    setup_watch.ANOMALY,
    "autograd's anomaly detection on during training (torch.autograd.set_detect_anomaly(True), detect_anomaly()): "
    "every autograd node keeps its forward's stack, and with check_nan (the default) each backward node's outputs "
    "are checked for NaN, a sync each",
    "torch.autograd.set_detect_anomaly(False) (the default) for training; detect_anomaly() around one step while "
    "debugging", "PyTorch's autograd docs (anomaly detection: enable it only for debugging, it slows execution)",
    ("torch.autograd.set_detect_anomaly(True)", "with torch.autograd.detect_anomaly(check_nan=False)"), "CPU or GPU")
PROFILER = _setting(
    setup_watch.PROFILER,
    "a profiler the script started, still running in the training steps (torch.profiler.profile, "
    "torch.autograd.profiler): every op is recorded",
    "profile a few steps, torch.profiler.profile(schedule=torch.profiler.schedule(wait=1, warmup=1, active=3)) and "
    "prof.step() each step, or stop it (prof.stop()) before training",
    "PyTorch's profiler docs (a schedule limits the profiled steps, as long runs are expensive to trace)",
    ("profiler.start()", "with torch.profiler.profile():"), "CPU or GPU")
DETERMINISTIC = _setting(
    setup_watch.DETERMINISTIC,
    "torch.use_deterministic_algorithms(True): the deterministic kernels where they differ (no atomic adds in scatter "
    "and index_add, cuBLAS with a fixed workspace), and an error for ops that have none",
    "torch.use_deterministic_algorithms(False) (the default), outside the runs that need bitwise reproducibility",
    "PyTorch's reproducibility notes (deterministic operations are often slower than nondeterministic ones)",
    ("torch.use_deterministic_algorithms(True)", "torch.use_deterministic_algorithms(False)  # right"),
    "CPU or GPU; costs mostly on a GPU")
LAUNCH_BLOCKING = _setting(
    setup_watch.LAUNCH_BLOCKING,
    "CUDA_LAUNCH_BLOCKING=1 in the environment: every kernel launch waits for the kernel to finish, so the host never "
    "runs ahead of the GPU", "unset CUDA_LAUNCH_BLOCKING (it is for debugging: an error raised at the kernel that "
    "caused it)", "PyTorch's CUDA semantics notes (asynchronous execution; CUDA_LAUNCH_BLOCKING=1 for debugging)",
    ('os.environ["CUDA_LAUNCH_BLOCKING"] = "1"', 'os.environ["CUDA_LAUNCH_BLOCKING"] = "0"'),
    "CPU or GPU; costs only on a GPU")
CUDNN_BENCHMARK = Rule(
    "cudnn.benchmark off", "rule",
    "convolutions run with torch.backends.cudnn.benchmark off while each keeps its shapes every step: cuDNN's "
    "heuristics pick each algorithm instead of timing the candidates once",
    "torch.backends.cudnn.benchmark = True once, before the loop (it times each new shape once: leave it off where "
    "the shapes change every step)", "PyTorch's performance tuning guide (enable the cuDNN auto-tuner)",
    "the model's watch of the scanned steps: the shapes reaching convolution and cudnn.benchmark at each call",
    _untuned, Plant.of(GPU_PATH, "plain = plain_conv(images)", "tuned = tuned_conv(images)"), model.watch,
    "CPU or GPU; costs only on a GPU (cuDNN)", gated=True)
RULES = (ANOMALY, PROFILER, DETERMINISTIC, LAUNCH_BLOCKING, CUDNN_BENCHMARK)

"""Run a script under the doctor: its steps counted, each phase's instruments in turn, the report built.

`run_doctor` is the whole of ``pitfalls doctor`` but the printing: it checks the script, runs it unchanged in this
process until its steps are done (or it ends, raises, or spends the budget), shuts down the workers it left, then
turns what each phase measured into ranked findings. Dynamo's state is reset first (`torch._dynamo.reset`, "as if
you had started a fresh process"), so a script compiles as it would on its own, whatever ran before it here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import statistics
import sys
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from pitfalls.doctor import findings as build
from pitfalls.doctor.cuda_on_cpu import CudaOnCpu, explain_failure
from pitfalls.doctor.gpu import Bandwidth, copy_bandwidth
from pitfalls.doctor.loader import LoaderWatch
from pitfalls.doctor.options import DoctorOptions
from pitfalls.doctor.phases import Phases, StopRun
from pitfalls.doctor.report import (
    CPU_SCRIPT,
    NO_GPU,
    CompileFigures,
    DoctorReport,
    Failure,
    MemoryFigures,
    OneOff,
    RealSyncRow,
    StepsDone,
)
from pitfalls.doctor.script import Script, as_main, check_single_process, load_script
from pitfalls.doctor.steps import Budget, StepCounter
from pitfalls.probes.anatomy import Anatomy, anatomy
from pitfalls.probes.compiled import CompileWatch, reset_dynamo
from pitfalls.result import Unavailable
from pitfalls.targets import scanned_traceback

__all__ = ["run_doctor"]

# A rule's cost on a GPU: what its fix saves needs the step run with the fix.
NO_FIX_COST = "what the fix saves needs the step run with it"


@dataclass(frozen=True)
class _Ending:
    """How the script's run ended: a sentence, and the failure when it raised."""

    how: str
    failure: Failure | None = None


def _execute(script: Script, namespace: dict[str, object], counter: StepCounter) -> _Ending:
    def steps() -> str:
        return f"{counter.steps} step" + ("" if counter.steps == 1 else "s")

    def in_step() -> int:
        return counter.steps + 1 if counter.step_started else 0

    try:
        exec(script.code, namespace)  # noqa: S102 (running the user's script is the command's purpose)
    except StopRun as stop:
        return _Ending(f"stopped: {stop.reason}")
    except SystemExit as exit_:
        code = exit_.code
        if code in (None, 0):
            return _Ending(f"the script exited after {steps()}")
        return _Ending(f"the script exited with status {code} after {steps()}",
                       Failure(f"SystemExit: {code}", in_step()))
    except Exception as error:  # the script's own error: reported with what was measured before it
        last = traceback.format_exception_only(type(error), error)[-1].strip().splitlines()[0]
        failure = explain_failure(Failure(last, in_step(), scanned_traceback(error)), error)  # a CUDA call on a CPU
        return _Ending(f"the script raised after {steps()}", failure)
    return _Ending(f"the script ended after {steps()}")


def _run(script: Script, args: Sequence[str], phases: Phases, budget: Budget, counter: StepCounter,
         watch: LoaderWatch, compiles: CompileWatch, quiet_stdout: bool) -> _Ending:
    ending: _Ending | None = None
    out = sys.stdout
    try:
        with compiles, phases.definitions, counter, watch, as_main(script, args) as namespace:
            if quiet_stdout:
                sys.stdout = sys.stderr  # --json owns stdout; the script's own output goes to stderr
            try:
                with budget:
                    ending = _execute(script, namespace, counter)
            except StopRun as stop:  # the budget rang after the script returned, before the alarm was off
                ending = ending or _Ending(f"stopped: {stop.reason}")
            finally:
                sys.stdout = out
                phases.finish(counter.steps)
    finally:
        watch.shut_down()
    return ending if ending is not None else _Ending("stopped before the script's end")


def _memory(phases: Phases) -> MemoryFigures | None:
    timed = phases.timed
    if timed.cuda_peaks:
        return MemoryFigures("CUDA allocator", max(timed.cuda_peaks), int(statistics.median(timed.cuda_peaks)),
                             f"max allocated of each of {len(timed.cuda_peaks)} timed steps")
    group = phases.group_memory
    if group is None:
        return None
    if isinstance(group, Unavailable):
        return MemoryFigures("process group", None, None, f"unavailable: {group.reason}")
    return MemoryFigures(
        "process group", group.peak_pss, None,
        f"over {phases.memory_steps} steps after the timed ones: sum of PSS of this process and its loader workers "
        f"({group.peak_processes} processes at most), peak USS {group.peak_uss / (1 << 20):.1f} MiB, {group.samples} "
        f"samples every {group.interval_s * 1e3:.0f} ms",
    )


def _real_syncs(lines: dict[tuple[str, int], tuple[float, float]], phases: Phases) -> tuple[RealSyncRow, ...]:
    hazards: dict[tuple[str, int], float] = {}
    if phases.located is not None and phases.scanned_steps:
        for site in phases.located.sites:
            if site.line is not None:
                key = (site.line.path, site.line.lineno)
                hazards[key] = hazards.get(key, 0.0) + site.count / phases.scanned_steps
    return tuple(RealSyncRow(path, line, lines.get((path, line), (0.0, 0.0))[0], hazards.get((path, line), 0.0),
                             lines.get((path, line), (0.0, 0.0))[1])
                 for path, line in sorted(set(lines) | set(hazards)))


def _no_gpu(phases: Phases, bandwidth: Bandwidth | None) -> str:
    """Why the GPU's figures were not measured ("" when they were)."""
    if phases.real is not None and bandwidth is not None:
        return ""
    # Asked only now: the run is over, and nothing of CUDA was started before the script.
    return CPU_SCRIPT if torch.cuda.is_available() else NO_GPU


def _not_measured(phases: Phases, loader_seen: bool, compiled: bool, no_gpu: str) -> tuple[str, ...]:
    missing = []
    if no_gpu:
        missing += [
            f"real syncs by line (CUDA's sync debug mode): {no_gpu}",
            f"what each sync stalls the step: {no_gpu} (the syncs are counted; their {build.NO_CPU_COST})",
            f"copy costs (bytes over the device's bandwidth): {no_gpu}",
            f"the CUDA allocator's peak: {no_gpu} (the process group's memory instead)",
        ]
    if not phases.timed.step_s:
        missing.append("step time, the loader's wait and memory: no step was timed")
    elif not loader_seen:
        missing.append("the loader's wait: the timed steps took no batch from a DataLoader")
    if compiled:
        missing.append("what a graph break costs a step: it needs the step without the break")
    return tuple(missing)


def _one_off(phases: Phases, watch: LoaderWatch, compile_s: float | None) -> tuple[OneOff, ...]:
    found = [OneOff("time to the first step's end", phases.first_step_s, "the script's set-up and its first step, "
                                                                         "run eagerly under the provenance record")]
    if compile_s is not None:
        found.append(OneOff("torch.compile", compile_s, "seconds compiling frames (dynamo and the backend)"))
    start = watch.start
    if start is not None:
        found.append(OneOff("time to the first batch", start.first_batch_s,
                            f"from iter(loader) to its first batch ({start.workers} workers)"))
        if start.workers:
            found.append(OneOff("workers' start", start.start_s, f"iter(loader) starting {start.workers} workers"))
    return tuple(found)


def _anatomy(phases: Phases) -> Anatomy | None:
    if not phases.anatomy_batches:
        return None
    try:
        return anatomy(phases.anatomy_batches)
    except (ValueError, TypeError):  # a batch with no tensor, or tensors of no fixed structure
        return None


def run_doctor(
    script: str | os.PathLike[str],
    args: Sequence[str] = (),
    options: DoctorOptions | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    quiet_stdout: bool = False,
) -> DoctorReport:
    """Run a training script unchanged, in this process, under each instrument in turn, and report.

    Args:
        script: the script's path.
        args: its arguments.
        options: the steps of each phase and the budget (None: the defaults).
        environ: the environment to check for a distributed launcher (None: `os.environ`).
        quiet_stdout: send the script's standard output to standard error (stdout is the JSON report's).

    Returns:
        The `DoctorReport`.

    Raises:
        ScriptError: the script is missing, is not valid Python, or was started under a launcher.
    """
    options = options or DoctorOptions()
    check_single_process(environ)
    loaded = load_script(script)
    reset_dynamo()  # the script compiles as in a fresh process, whatever this one compiled before
    began = time.perf_counter()
    phases = Phases(options)
    budget = Budget(options.budget_s)
    counter = StepCounter(budget, phases)
    watch = LoaderWatch(counter, phases)
    compiles = CompileWatch()
    # --cuda-on-cpu: entered before the script, so its mode is below every instrument the phases enter.
    with CudaOnCpu(phases.provenance) if options.cuda_on_cpu else contextlib.nullcontext() as mapped:
        ending = _run(loaded, args, phases, budget, counter, watch, compiles, quiet_stdout)
    bandwidth: Bandwidth | None = None
    if phases.on_cuda and torch.cuda.is_initialized():
        bandwidth = copy_bandwidth(torch.device("cuda", torch.cuda.current_device()))
    report = _report(loaded, args, options, phases, counter, watch, compiles, ending, bandwidth,
                     time.perf_counter() - began)
    return report if mapped is None else dataclasses.replace(report, cuda_on_cpu=mapped.figures())


def _report(script: Script, args: Sequence[str], options: DoctorOptions, phases: Phases, counter: StepCounter,
            watch: LoaderWatch, compiles: CompileWatch, ending: _Ending, bandwidth: Bandwidth | None,
            wall_s: float) -> DoctorReport:
    timed = phases.timed
    step_ms = mean_ms = None
    if timed.step_s:
        ms = sorted(s * 1e3 for s in timed.step_s)
        mean_ms = statistics.fmean(ms)
        step_ms = (statistics.median(ms), ms[min(len(ms) - 1, int(0.9 * len(ms)))], mean_ms)
    shape = _anatomy(phases)
    loader = build.loader_figures(timed, shape)
    lines = phases.real.per_line(phases.gpu_steps) if phases.real is not None and phases.gpu_steps else None
    real = None if lines is None else _real_syncs(lines, phases)
    stalls = None if lines is None else {where: stall for where, (_syncs, stall) in lines.items()}
    no_gpu = _no_gpu(phases, bandwidth)
    breaks, recompiles, compile_s = compiles.graph_breaks, compiles.recompiles, compiles.compile_s
    unavailable = "; ".join(x.reason for x in (breaks, recompiles) if isinstance(x, Unavailable))
    breaks = () if isinstance(breaks, Unavailable) else breaks
    recompiles = () if isinstance(recompiles, Unavailable) else recompiles
    found = [
        *([build.loader_finding(loader, watch.line)] if loader is not None else []),
        *build.sync_findings(phases.located, phases.scanned_steps, counter.step_functions, stalls),
        *build.copy_findings(phases.copies, phases.scanned_steps, bandwidth, no_gpu),
        *build.compile_findings(breaks, recompiles, timed),
        *build.memory_findings(shape, loader.batches_per_step if loader else 1.0, watch.line, bandwidth, no_gpu),
        *(phases.rules.findings(phases.scanned_steps, no_gpu or NO_FIX_COST) if phases.rules is not None else ()),
    ]
    ranked = build.rank(found, mean_ms)
    compile_figures = CompileFigures(
        graph_breaks=tuple({"reason": b.reason, "path": b.path, "line": b.line, "explanation": b.explanation,
                            "hint": b.hint} for b in breaks),
        recompiles=tuple({"function": r.function, "path": r.path, "reason": r.reason,
                          "during_timed_steps": timed.during(r.started)}
                         for r in recompiles),
        compile_s=None if isinstance(compile_s, Unavailable) else compile_s,
        unavailable=unavailable,
    )
    compiled = bool(breaks or recompiles or (not isinstance(compile_s, Unavailable) and compile_s > 0))
    done = counter.steps
    o = options
    steps = StepsDone(
        warmup=min(done, o.warmup), measured=len(timed.step_s), memory=phases.memory_steps,
        before_scan=min(max(done - o.warmup - o.steps - phases.memory_steps, 0), o.bridge),
        scanned=phases.scanned_steps,
        gpu=phases.gpu_steps, counted_by=counter.by, total=done)
    return DoctorReport(
        script=str(script.path), argv=tuple(args), steps=steps, ended=ending.how, failure=ending.failure,
        step_ms=step_ms, findings=ranked, loader=loader, compile=compile_figures, memory=_memory(phases),
        copies=build.copy_rows(phases.copies, phases.scanned_steps), real_syncs=real,
        bandwidth=() if bandwidth is None else tuple(
            (f"{direction}, {'pinned' if pinned else 'pageable'}", rate / 1e9)
            for direction, pinned, rate in bandwidth.rates),
        one_off=_one_off(phases, watch, compile_figures.compile_s),
        not_measured=_not_measured(phases, loader is not None, compiled, no_gpu),
        wall_s=wall_s,
        no_gpu=no_gpu,
        digests=tuple(phases.digests),
    )

"""Run a script under the doctor: its steps counted, each phase's instruments in turn, the report built from what
the phases recorded (`records.Seen`) and what every rule found in it (`rules.findings`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from pitfalls.doctor import reasons, rules
from pitfalls.doctor.copies import Bandwidth, copy_bandwidth
from pitfalls.doctor.cuda_on_cpu import CudaOnCpu, explain_failure
from pitfalls.doctor.loader import LoaderWatch
from pitfalls.doctor.options import DoctorOptions
from pitfalls.doctor.phases import Phases, StopRun
from pitfalls.doctor.ranks import Ranks
from pitfalls.doctor.records import ScanRecord, Seen, TimedRecord
from pitfalls.doctor.report import (
    CompileSummary,
    CopyRow,
    DoctorReport,
    Failure,
    LoaderFigures,
    MemoryFigures,
    OneOff,
    RealSyncRow,
    RecompileRow,
    StepsDone,
    line_fields,
    rank,
)
from pitfalls.doctor.script import Script, as_main, load_script
from pitfalls.doctor.steps import Budget, StepCounter
from pitfalls.families.loader.verdict import Verdict
from pitfalls.probes.compiled import CompileWatch, reset_dynamo
from pitfalls.probes.sites import SourceLine
from pitfalls.result import Unavailable
from pitfalls.targets import scanned_traceback

__all__ = ["run_doctor"]


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
        with compiles, phases.definitions, phases.ddp, counter, watch, as_main(script, args) as namespace:
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


def _loader(timed: TimedRecord | None, scan: ScanRecord | None, line: SourceLine | None) -> LoaderFigures | None:
    """The loader's figures over the timed steps, with the anatomy of the batches asked for at ``line`` from the
    scan; None when the timed steps took no batch."""
    if timed is None or sum(timed.batches) == 0:
        return None
    step_s, wait_s = statistics.fmean(timed.step_s), statistics.fmean(timed.wait_s)
    verdict = Verdict(sum(timed.wait_s) / sum(timed.step_s), step_s, wait_s, timed.workers)
    shape = scan.anatomies.get(line) if scan is not None else None
    tensors = tuple(
        {"tensor": t.path, "shape": list(t.shape), "dtype": t.dtype, "bytes": t.bytes,
         "smallest_lossless": t.smaller_dtype, "bytes_then": t.bytes_if_smaller, "how": t.how}
        for t in (shape.tensors if shape is not None else ())
    )
    return LoaderFigures(
        wait_share=verdict.wait_share, ms_per_step=wait_s * 1e3, verdict=verdict.bound,
        batch_bytes=shape.bytes_per_batch if shape is not None else None,
        batches_per_step=statistics.fmean(timed.batches), workers=timed.workers, anatomy=tensors,
    )


def _memory(phases: Phases) -> MemoryFigures | None:
    timed, memory = phases.timed, phases.memory
    if timed is not None and timed.cuda_peaks:
        return MemoryFigures("CUDA allocator", max(timed.cuda_peaks), int(statistics.median(timed.cuda_peaks)),
                             f"max allocated of each of {len(timed.cuda_peaks)} timed steps")
    if memory is None:
        return None
    group = memory.group
    if isinstance(group, Unavailable):
        return MemoryFigures("process group", None, None, f"unavailable: {group.reason}")
    return MemoryFigures(
        "process group", group.peak_pss, None,
        f"over {memory.steps} steps after the scanned ones: sum of PSS of this process and its loader workers "
        f"({group.peak_processes} processes at most), peak USS {group.peak_uss / (1 << 20):.1f} MiB, {group.samples} "
        f"samples every {group.interval_s * 1e3:.0f} ms",
    )


def _real_syncs(phases: Phases) -> tuple[RealSyncRow, ...] | None:
    gpu, scan = phases.gpu, phases.scan
    if gpu is None:
        return None
    hazards: dict[tuple[str, int], float] = {}
    if scan is not None:
        for site in scan.hazards.sites:
            if site.line is not None:
                key = (site.line.path, site.line.lineno)
                hazards[key] = hazards.get(key, 0.0) + site.count / scan.steps
    lines = gpu.per_line
    return tuple(RealSyncRow(path, line, lines.get((path, line), (0.0, 0.0))[0], hazards.get((path, line), 0.0),
                             lines.get((path, line), (0.0, 0.0))[1])
                 for path, line in sorted(set(lines) | set(hazards)))


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


def run_doctor(
    script: str | os.PathLike[str],
    args: Sequence[str] = (),
    options: DoctorOptions | None = None,
    *,
    ranks: Ranks | None = None,
    quiet_stdout: bool = False,
) -> DoctorReport:
    """Run a training script unchanged, in this process, under each instrument in turn, and report.

    Args:
        script: the script's path.
        args: its arguments.
        options: the steps of each phase and the budget (None: the defaults).
        ranks: the other ranks, where torchrun started this one (`Ranks.from_environ`): the phases end together,
            and the run's end stops the others (None: one process; each rank of a torchrun then runs on its own).
        quiet_stdout: send the script's standard output to standard error (stdout is the JSON report's).

    Returns:
        The `DoctorReport`.

    Raises:
        ScriptError: the script is missing or is not valid Python.
    """
    options = options or DoctorOptions()
    loaded = load_script(script)
    reset_dynamo()  # the script compiles as in a fresh process, whatever this one compiled before
    began = time.perf_counter()
    phases = Phases(options, ranks)
    budget = Budget(options.budget_s)
    counter = StepCounter(budget, phases)
    watch = LoaderWatch(counter, phases)
    compiles = CompileWatch()
    watches = {make: make() for make in rules.watches()}
    with contextlib.ExitStack() as stack:
        # Ranks first, so that the script's process group is made through its timeout cap, under the mapping's
        # nccl -> gloo. --cuda-on-cpu: entered before the script, so its mode is below every instrument the phases
        # enter; the rules' watches of the whole run see the script's calls as the mapping passes them on.
        if ranks is not None:
            stack.enter_context(ranks)
        mapped = stack.enter_context(CudaOnCpu(phases.provenance)) if options.cuda_on_cpu else None
        for one in watches.values():
            stack.enter_context(one)
        ending = _run(loaded, args, phases, budget, counter, watch, compiles, quiet_stdout)
        if ranks is not None and not phases.done:  # a run that ended early stops the other ranks at their barrier
            ranks.ended(ending.how)
    bandwidth: Bandwidth | None = None
    if phases.on_cuda and torch.cuda.is_initialized():
        bandwidth = copy_bandwidth(torch.device("cuda", torch.cuda.current_device()))
    report = _report(loaded, args, phases, counter, watch, compiles, watches, ending, bandwidth,
                     time.perf_counter() - began)
    return dataclasses.replace(report, rank=None if ranks is None else ranks.rank,
                               cuda_on_cpu=None if mapped is None else mapped.figures())


def _report(script: Script, args: Sequence[str], phases: Phases, counter: StepCounter, watch: LoaderWatch,
            compiles: CompileWatch, rule_watches: Mapping[Callable[[], Any], Any], ending: _Ending,
            bandwidth: Bandwidth | None, wall_s: float) -> DoctorReport:
    """The report, built from the phases' records and what the run's watches saw (the loader's, torch.compile's and
    the rules')."""
    timed, scan = phases.timed, phases.scan
    # Asked only now, once the run is over: nothing of CUDA was started before the script.
    no_gpu = "" if phases.gpu is not None and bandwidth is not None else (
        reasons.SCRIPT_NO_GPU if torch.cuda.is_available() else reasons.NO_GPU)
    breaks, recompiles, compile_s = compiles.graph_breaks, compiles.recompiles, compiles.compile_s
    unavailable = "; ".join(x.reason for x in (breaks, recompiles) if isinstance(x, Unavailable))
    breaks = () if isinstance(breaks, Unavailable) else breaks
    recompiles = () if isinstance(recompiles, Unavailable) else recompiles
    line = timed.loader_line if timed is not None and timed.loader_line is not None else watch.line
    seen = Seen(timed, scan, phases.gpu, phases.memory, _loader(timed, scan, line), line, breaks, recompiles,
                bandwidth, no_gpu, counter.step_functions, rule_watches)
    step_ms = None
    if timed is not None:
        ms = sorted(s * 1e3 for s in timed.step_s)
        step_ms = (statistics.median(ms), ms[min(len(ms) - 1, int(0.9 * len(ms)))], statistics.fmean(ms))
    summary = CompileSummary(
        graph_breaks=breaks,
        recompiles=tuple(RecompileRow(r.function, r.path, r.reason, timed is not None and timed.during(r.started))
                         for r in recompiles),
        compile_s=None if isinstance(compile_s, Unavailable) else compile_s,
        unavailable=unavailable,
    )
    compiled = bool(breaks or recompiles or summary.compile_s)
    ran = phases.ran
    steps = StepsDone(warmup=ran.get("warmup", 0), measured=ran.get("timed", 0), memory=ran.get("memory", 0),
                      before_scan=ran.get("before_scan", 0), scanned=ran.get("scanned", 0), gpu=ran.get("gpu", 0),
                      counted_by=counter.by, total=counter.steps)
    copies = () if scan is None else tuple(
        CopyRow(**line_fields(site.line), call=site.call, direction=site.direction, pinned=site.pinned,
                blocking=site.blocking, per_step=site.count / scan.steps, bytes_per_step=site.bytes / scan.steps)
        for site in scan.copies)
    return DoctorReport(
        script=str(script.path), argv=tuple(args), steps=steps, ended=ending.how, failure=ending.failure,
        step_ms=step_ms, findings=rank(rules.findings(seen), step_ms[2] if step_ms else None), loader=seen.loader,
        compile=summary, memory=_memory(phases), copies=copies, real_syncs=_real_syncs(phases),
        bandwidth=() if bandwidth is None else tuple(
            (f"{direction}, {'pinned' if pinned else 'pageable'}", rate / 1e9)
            for direction, pinned, rate in bandwidth.rates),
        one_off=_one_off(phases, watch, summary.compile_s),
        not_measured=reasons.not_measured(no_gpu, phases.short(counter.steps), timed is not None,
                                          seen.loader is not None, compiled),
        wall_s=wall_s,
        no_gpu=no_gpu,
        digests=tuple(phases.digests),
        ddp=None if timed is None else timed.ddp,
    )

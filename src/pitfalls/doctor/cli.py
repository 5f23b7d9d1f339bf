"""`pitfalls doctor [--steps N] [--warmup W] [--scanned S] [--budget SECONDS] [--json] [--nproc-per-node N] SCRIPT
[-- ARGS...]`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from pitfalls.argtypes import positive
from pitfalls.doctor import baseline
from pitfalls.doctor.launch import launch
from pitfalls.doctor.options import DEFAULT_BUDGET_S, DEFAULT_SCANNED, DEFAULT_STEPS, DEFAULT_WARMUP, DoctorOptions
from pitfalls.doctor.ranks import Ranks, launched
from pitfalls.doctor.render import render, render_gate, render_tried
from pitfalls.doctor.report import DoctorReport
from pitfalls.doctor.run import run_doctor
from pitfalls.doctor.script import ScriptError, load_script
from pitfalls.doctor.try_child import parse_setting
from pitfalls.doctor.try_settings import AUTO, DIGESTS, Tried, choose, try_settings
from pitfalls.doctor.world import combine, render_world
from pitfalls.families.loader.workers import usable_cores

__all__ = ["cmd_doctor", "register"]

EXIT_INTERRUPTED = 130


def _stderr(line: str) -> None:
    print(f"pitfalls doctor: {line}", file=sys.stderr)


def _try_argument(text: str) -> str | dict[str, int | bool]:
    """A --try value: "loader" (settings chosen from the cores and the wait) or a setting."""
    if text.strip() == AUTO:
        return AUTO
    try:
        return parse_setting(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _tried(report: DoctorReport, options: DoctorOptions, asked: list[str | dict[str, int | bool]]) -> Tried:
    """The settings asked for with --try, run; or none and why."""
    if report.failure is not None:
        return Tried((), "the script failed before its steps were done")
    settings = [setting for setting in asked if isinstance(setting, dict)]
    if AUTO in asked:
        mean_ms = report.step_ms[2] if report.step_ms else None
        chosen, why = choose(report.loader, mean_ms, not report.no_gpu, usable_cores())
        if not chosen and not settings:
            return Tried((), why)
        settings += [setting for setting in chosen if setting not in settings]
    if report.loader is None:
        return Tried((), "the timed steps took no batch from a DataLoader")
    return try_settings(report, options, settings)


def _rank_argv(args: argparse.Namespace, script_args: list[str]) -> list[str]:
    """The doctor's arguments for every rank that `--nproc-per-node` starts: the same, but the rank count."""
    flags = [("--json", args.json), ("--cuda-on-cpu", args.cuda_on_cpu)]
    files = [("--save-baseline", args.save_baseline), ("--baseline", args.baseline)]
    return ["--warmup", str(args.warmup), "--steps", str(args.steps), "--scanned", str(args.scanned), "--budget",
            str(args.budget), *(flag for flag, on in flags if on), *(part for flag, path in files if path
                                                                      for part in (flag, path)),
            args.script, "--", *script_args]


def _launched(args: argparse.Namespace, script_args: list[str]) -> int:
    """`--nproc-per-node N`: the same command in N ranks, through torchrun (checked here first, once)."""
    if launched():
        raise ScriptError("--nproc-per-node starts the ranks itself: give it without a launcher, or run under "
                          "torchrun without it")
    if args.tries:
        raise ScriptError("--try runs the script again in fresh processes, one process each: not with "
                          "--nproc-per-node or under torchrun")
    load_script(args.script)
    return launch(args.nproc_per_node, _rank_argv(args, script_args))


def cmd_doctor(args: argparse.Namespace, console: Console) -> int:
    """Run `pitfalls doctor`; returns the exit status (0; 1 when the script failed or the baseline gate failed, on
    the worst rank under torchrun; 2 bad input; 130 Ctrl-C)."""
    script_args = list(args.script_args)
    if script_args[:1] == ["--"]:
        script_args = script_args[1:]
    options = DoctorOptions(warmup=args.warmup, steps=args.steps, scanned=args.scanned, budget_s=args.budget,
                            digests=DIGESTS if args.tries else 0, cuda_on_cpu=args.cuda_on_cpu)
    try:
        if args.nproc_per_node is not None:
            return _launched(args, script_args)
        ranks = Ranks.from_environ(args.budget)
        if ranks is not None and args.tries:
            raise ScriptError("--try runs the script again in fresh processes, one process each: not under torchrun")
        files = ranks is None or ranks.rank == 0  # the doctor's own files: rank 0's alone
        saved = baseline.load(Path(args.baseline)) if args.baseline and files else None
        save = Path(args.save_baseline) if args.save_baseline and files else None
        if save is not None and not save.parent.is_dir():
            raise baseline.BaselineError(f"--save-baseline {str(save)!r}: its folder {str(save.parent)!r} does not "
                                         "exist")
        report = run_doctor(args.script, script_args, options, ranks=ranks, quiet_stdout=args.json)
    except (ScriptError, baseline.BaselineError) as error:
        _stderr(str(error))
        return 2
    except KeyboardInterrupt:
        _stderr("interrupted; every worker of the script's loaders is stopped")
        return EXIT_INTERRUPTED
    sys.stdout.flush()
    gate = baseline.compare(saved, report, args.baseline) if saved is not None else None
    try:
        tried = _tried(report, options, args.tries) if args.tries else None
    except KeyboardInterrupt:
        _stderr("interrupted while trying the loader's settings")
        return EXIT_INTERRUPTED
    status = 1 if report.failure is not None or (gate is not None and gate.failed) else 0
    data = report.as_json()
    if gate is not None:
        data["baseline"] = gate.as_json()
    if tried is not None:
        data["try"] = [row.as_json() for row in tried.rows] if tried.rows else f"not run: {tried.note}"
        data["try_note"] = tried.note or None
    world = None
    if ranks is not None:
        ranks.send({**data, "exit_status": status})
        if ranks.rank != 0:  # rank 0 prints every rank's report; this rank's status is in it
            _traceback(report)
            return 0
        world = combine(ranks.gather(), ranks.first_to_end())
    if args.json:
        print(json.dumps(data if world is None else world, indent=2))
    else:
        render(report, console)
        if tried is not None:
            render_tried(tried, console)
        if gate is not None:
            render_gate(gate, console)
        if world is not None:
            render_world(world, console)
    _traceback(report)
    if save is not None:
        if report.failure is not None:
            _stderr(f"--save-baseline {args.save_baseline!r} not written: the script failed before its steps were "
                    "done")
        else:
            try:
                baseline.save(report, save)
            except baseline.BaselineError as error:
                _stderr(str(error))
                return 2
    return status if world is None else int(world["exit_status"])


def _traceback(report: DoctorReport) -> None:
    if report.failure is not None and report.failure.traceback:
        print(report.failure.traceback, file=sys.stderr, end="")  # the script's own, from its first frame


def register(commands: Any) -> None:
    """Add the `doctor` subcommand to the command line's subparsers."""
    parser = commands.add_parser(
        "doctor",
        help="run your training script for a few steps under every instrument: what slows its step, ranked",
        description=(
            "Run SCRIPT unchanged, in this process, as `python SCRIPT ARGS` would (its __name__ is __main__), for "
            "--warmup steps, then --steps timed steps (step time, the DataLoader's wait, memory), then one step "
            "under the provenance record and --scanned steps under the sync-hazard counter, the copy recorder and "
            "the rules of PyTorch's profiler and Nsight Systems (and as many under CUDA's sync debug mode where the "
            "script uses a GPU); then stop it and report what costs its step, ranked, each with its fix."
        ),
        epilog=(
            "A step ends at the first torch.optim optimizer's step (a script without one: at each DataLoader batch). "
            "Give the script's own arguments after --. Exit status: 0; 1 when the script raised (or exited with an "
            "error) before its steps were done, after the report of what was measured, or when --baseline found "
            "something new (under torchrun, the worst rank's); 2 when SCRIPT is missing or is not valid Python, a "
            "baseline file cannot be read or written, or a launcher other than torchrun started it; 130 on Ctrl-C. "
            "With --json the script's own output goes to stderr. Under torchrun (torchrun --nproc-per-node N -m "
            "pitfalls doctor ...) every rank runs the doctor, the ranks end each phase together, and rank 0 prints "
            "the report of every rank."
        ),
    )
    parser.add_argument("--steps", type=positive(int), default=DEFAULT_STEPS,
                        help=f"timed steps (default {DEFAULT_STEPS})")
    parser.add_argument("--warmup", type=positive(int), default=DEFAULT_WARMUP,
                        help=f"steps before timing; the first runs eagerly (default {DEFAULT_WARMUP})")
    parser.add_argument("--scanned", type=positive(int), default=DEFAULT_SCANNED,
                        help=f"steps under the hazard counter (default {DEFAULT_SCANNED}: a line run every fifth "
                             "step reads 0.2)")
    parser.add_argument("--budget", type=positive(float), default=DEFAULT_BUDGET_S, metavar="SECONDS",
                        help=f"stop the script after this many seconds wherever it is (default {DEFAULT_BUDGET_S:g})")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--nproc-per-node", type=positive(int), metavar="N",
                        help="run the doctor in N ranks on this machine through torchrun (torch.distributed.run), "
                             "its stores and the ranks' gloo sockets on loopback only; rank 0 prints every rank's "
                             "report")
    parser.add_argument("--cuda-on-cpu", action="store_true",
                        help="run a script written for CUDA on this CPU, taking its GPU path: its CUDA tensors live "
                             "on the CPU and read as device data, nccl runs on gloo, autocast and GradScaler on the "
                             "CPU (docs/doctor.md, --cuda-on-cpu)")
    parser.add_argument("--try", dest="tries", action="append", type=_try_argument, metavar="SETTING",
                        help="run the script again, in fresh processes, with each DataLoader setting (repeatable): "
                             "'loader' chooses them from the cores and the measured wait, or give one, e.g. "
                             "'num_workers=2,pin_memory=True' (num_workers, pin_memory, persistent_workers, "
                             "prefetch_factor); each row: step time, wait share, speedup, same batches")
    gate = parser.add_mutually_exclusive_group()
    gate.add_argument("--save-baseline", metavar="FILE",
                      help="write the sync lines with their counts per step, the copies, the graph breaks and the "
                           "rules found, for a later --baseline")
    gate.add_argument("--baseline", metavar="FILE",
                      help="exit 1 naming each new line, each count that grew, each new graph break or rule against "
                           "FILE (lines matched by their code and function, not their number)")
    parser.add_argument("script", metavar="SCRIPT", help="the training script")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, metavar="-- ARGS",
                        help="the script's own arguments")
    parser.set_defaults(run=cmd_doctor)

"""`scripts/gpu-run OUT --budget SECONDS`: the GPU work in a fixed priority order, never a piece it cannot finish.

After every piece the run rewrites its files (``plan.json``, ``run.json``, ``costs.json``, ``figures.json``,
``report.md``, the archive), so a run stopped from outside keeps everything finished.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pitfalls import processes
from pitfalls.checkout import ROOT
from pitfalls.gpu_run import report
from pitfalls.gpu_run.archive import pack
from pitfalls.gpu_run.costs import RUN_COSTS, Costs, merge_costs, run_costs
from pitfalls.gpu_run.outcome import write_json
from pitfalls.gpu_run.pieces import FACTS, PIECES, piece_file
from pitfalls.gpu_run.plan import DONE, MARGIN_S, NOT_SELECTED, OVER_BUDGET, Entry, Launcher, Piece, launch, schedule
from pitfalls_asv_main import atomic_write

__all__ = ["RunOptions", "run"]


# Every fact of the machine and its stack, read as `pitfalls probe` reads them.
_ENVIRONMENT = "import json; from pitfalls.probes.environment import environment; print(json.dumps(environment()))"


def _environment() -> dict[str, Any]:
    """torch and its git version, CUDA, cuDNN, driver, GPUs, CPU, Python, container image and the suite's commit,
    read in a child (this process never touches CUDA); the reason, when the child could not read them."""
    done = processes.run([sys.executable, "-c", _ENVIRONMENT], timeout_s=300, capture_output=True, text=True)
    if done.returncode == 0:
        return dict(json.loads(done.stdout.strip().splitlines()[-1]))
    said = (done.stderr.strip() or "no output").splitlines()[-1]
    return {"unavailable": f"the environment could not be read: {said}"}


def _facts(device: str, budget_s: float, root: Path) -> dict[str, Any]:
    from pitfalls.runner.machine import hardware as read_hardware
    from pitfalls.runner.machine import machine_name
    from pitfalls.runner.worktree import commit_of

    hardware = read_hardware(sys.executable, device)  # in a child: this process never touches CUDA
    machine = os.environ.get("PITFALLS_MACHINE") or machine_name(hardware)
    try:
        commit: str | None = commit_of(root)
    except Exception as error:  # noqa: BLE001 - no checkout: the run says so, the asv slices fail with it
        commit = f"unknown ({type(error).__name__}: {error})"
    # The cost file's kind: "cpu" for every CPU run (the same sizes on machines of this project's kind), the GPU
    # machine's name on a GPU (an H200 and an A10G take different times).
    kind = "cpu" if device == "cpu" else machine
    return {"device": device, "machine": machine, "kind": kind, "budget_s": budget_s,
            "date": time.strftime("%Y-%m-%d", time.gmtime()), "commit": commit, "python": platform.python_version(),
            "hardware": hardware, "environment": _environment(), "root": str(root)}


def _child_launcher(out: Path) -> Launcher:
    def run_child(piece: Piece, timeout_s: float) -> tuple[int | None, bool]:
        command = piece.command or (sys.executable, "-m", "pitfalls.gpu_run", "piece", piece.name, str(out))
        log = piece_file(out, piece.name, "logs", ".log")
        return launch(command, timeout_s, log, env={**os.environ, "PYTHONUNBUFFERED": "1"})

    return run_child


def _say(entry: Entry) -> None:
    took = f" in {entry.seconds:.0f} s" if entry.started else ""
    note = f" ({entry.reason})" if entry.reason and entry.status != OVER_BUDGET else ""
    print(f"gpu-run: {entry.name}: {entry.reason if entry.status == OVER_BUDGET else entry.status + took}{note} "
          f"[expected {entry.cost_s:.0f} s, {entry.cost_from}; {max(entry.left_s, 0):.0f} s were left]",
          file=sys.stderr, flush=True)


@dataclass(frozen=True)
class RunOptions:
    """How to run.

    Attributes:
        budget_s: seconds for the whole run (a piece started in time may run ``margin_s`` past it).
        device: "cuda" or "cpu" (a rehearsal at small sizes).
        costs_file: the committed cost file read for the plan.
        archive: pack the run into this file after every piece (None: do not pack).
        only: run these pieces alone (names); every piece when empty.
        record_costs: fold what the pieces took into ``costs_file`` at the end.
        pieces: the pieces, in priority order (tests plant their own).
        clock: seconds, monotonic (tests plant a fake).
        launcher: runs a piece (tests plant a fake); None runs each in its own process.
        margin_s: seconds a piece may run past the budget before it is stopped.
    """

    budget_s: float
    device: str
    costs_file: Path
    archive: Path | None = None
    only: tuple[str, ...] = ()
    record_costs: bool = False
    pieces: tuple[Piece, ...] = PIECES
    clock: Callable[[], float] = time.monotonic
    launcher: Launcher | None = None
    margin_s: float = MARGIN_S


def run(out: Path, options: RunOptions, root: Path = ROOT) -> int:
    """Run the pieces into ``out`` (a new or empty folder); returns 0 when every piece run is done, else 1.

    Raises:
        ValueError: ``out`` holds files, an unknown piece in ``only``, or a cost file that is not one.
    """
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"{out} is not an empty folder: a run writes into a folder of its own")
    unknown = [name for name in options.only if name not in {p.name for p in options.pieces}]
    if unknown:
        raise ValueError(f"--only: no such piece {', '.join(map(repr, unknown))} (see `scripts/gpu-run plan`)")
    costs = Costs.read(options.costs_file)
    out.mkdir(parents=True, exist_ok=True)
    facts = _facts(options.device, options.budget_s, root)
    write_json(out / FACTS, facts)
    kind = facts["kind"]

    def cost(piece: Piece) -> tuple[float, str]:
        return costs.cost(piece, kind, options.device)

    write_json(out / "plan.json", {**facts, "pieces": [
        {"name": p.name, "group": p.group, "title": p.title, "cost_s": round(cost(p)[0], 1), "from": cost(p)[1]}
        for p in options.pieces]})
    began = options.clock()
    entries: list[Entry] = []

    def save(seconds: float | None) -> None:
        write_json(out / "run.json", {**facts, "seconds": seconds, "pieces": [e.as_json() for e in entries]})
        write_json(out / RUN_COSTS, run_costs(kind, entries))
        data = report.figures(options.pieces, entries, out, facts, seconds)
        write_json(out / "figures.json", data)
        text = report.render(data, entries, options.pieces)
        atomic_write(out / "report.md", lambda tmp: tmp.write_text(text, encoding="utf-8"))
        if options.archive is not None:
            pack(out, options.archive)

    def on_entry(entry: Entry) -> None:
        entries.append(entry)
        _say(entry)
        save(None)

    save(None)
    schedule(options.pieces, budget_s=options.budget_s, cost=cost, launch=options.launcher or _child_launcher(out),
             clock=options.clock, on_entry=on_entry,
             selected=lambda piece: not options.only or piece.name in options.only, margin_s=options.margin_s)
    save(round(options.clock() - began, 1))
    print("\n".join(["gpu-run: summary", *report.summary_lines(entries)]), file=sys.stderr, flush=True)
    if options.record_costs:
        changed = merge_costs(out / RUN_COSTS, options.costs_file)
        print(f"gpu-run: {len(changed)} cost(s) recorded in {options.costs_file}", file=sys.stderr)
    return 0 if all(e.status in (DONE, OVER_BUDGET, NOT_SELECTED) for e in entries) else 1

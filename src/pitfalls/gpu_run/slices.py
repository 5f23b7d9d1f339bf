"""One asv benchmark class's cases for one device, run into a staging copy and merged into the run's results.

A slice is a whole ``asv run`` of the checkout's commit in the ``installed`` environment (the interpreter at
hand, as the main job runs), selecting one class's cases on the device. asv writes into a copy of the run's
results folder; when it has finished, the entries it measured are merged into ``OUT/results`` under the folder's
lock, signals held, each file replaced by an atomic rename: a slice stopped part-way leaves the earlier slices'
results exactly as they were.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pitfalls import runner
from pitfalls.runner import store
from pitfalls.runner.job import INSTALLED_ENV, signals_deferred
from pitfalls.runner.worktree import head_commit
from pitfalls_asv_main import command as asv_command

__all__ = ["AsvSlice", "run_slice"]


@dataclass(frozen=True)
class AsvSlice:
    """One benchmark class of the suite, its cases on one device.

    Attributes:
        module: the benchmark module, e.g. "bench_loss".
        cls: the class, e.g. "Step".
        device_axis: whether the class sweeps devices (the Cuda and Nvml classes run on CUDA only and do not).
        mode_axis: whether it sweeps eager and compiled (on a CPU rehearsal only the eager cases run).
    """

    module: str
    cls: str
    device_axis: bool = True
    mode_axis: bool = True

    @property
    def name(self) -> str:
        return f"asv {self.module}.{self.cls}"

    def selection(self, device: str) -> str:
        """The ``asv run -b`` pattern of this class's cases on ``device`` (asv matches it against each case's name
        with its parameters, ``bench_loss.Step.time_step('naive', 4, 64, 'cuda', 'eager')``)."""
        pattern = rf"^{re.escape(self.module)}\.{re.escape(self.cls)}\.\w+"
        if not self.device_axis:
            return pattern
        pattern += rf"\(.*'{re.escape(device)}'"
        if device == "cpu" and self.mode_axis:
            pattern += r", 'eager'\)$"  # a CPU has minutes, not the compiles' hour: the rehearsal runs eagerly
        return pattern


def run_slice(piece: AsvSlice, out: Path, device: str, machine: str, facts: dict[str, Any],
              root: Path) -> dict[str, Any]:
    """Run one slice and merge its results into ``out/results``.

    Args:
        piece: the class and its cases.
        out: the run's folder.
        device: "cuda" or "cpu".
        machine: the asv machine name the results go under.
        facts: the machine's hardware facts (`pitfalls.runner.hardware`), read once by the run.
        root: the checkout (asv measures its HEAD commit).

    Returns:
        asv's exit status, the seconds, the selection, the files merged and the log's path.

    Raises:
        RuntimeError: no git checkout, or asv is missing (the slice cannot run here).
    """
    if shutil.which("git") is None or not (root / ".git").exists():
        raise RuntimeError(f"{root} is not a git checkout: asv measures a commit")
    results = out / "results"
    results.mkdir(parents=True, exist_ok=True)
    logs = out / "logs"
    logs.mkdir(exist_ok=True)
    log = logs / f"{piece.module}.{piece.cls}.log"
    with tempfile.TemporaryDirectory(dir=out, prefix=".slice-") as scratch:
        staged = Path(scratch) / "results"
        shutil.copytree(results, staged)
        before = store.snapshot(staged)
        runner.record_machine(machine, staged, facts)
        conf = runner.write_staged_conf(root / "asv.conf.json", scratch, results_dir=staged)
        command = [*asv_command(sys.executable), "run", "--config", str(conf), "--machine", machine,
                   "-E", INSTALLED_ENV, "--set-commit-hash", head_commit(root), "--show-stderr",
                   "-b", piece.selection(device)]
        started = time.perf_counter()
        done = subprocess.run(command, cwd=root, capture_output=True, text=True, check=False)
        seconds = time.perf_counter() - started
        log.write_text(" ".join(command) + "\n" + done.stdout + done.stderr, encoding="utf-8")
        merged: list[str] = []
        if done.returncode in (0, 2):  # 2: some case failed; its failure is a result too
            with store.locked(results), signals_deferred():
                merged = store.merge_into(staged, results, before=before)
    return {"exit_code": done.returncode, "seconds": round(seconds, 1), "selection": piece.selection(device),
            "merged": merged, "log": str(log.relative_to(out))}

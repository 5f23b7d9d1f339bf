"""One asv benchmark class's cases for one device: an ``asv run`` in the ``installed`` environment, staged as the main
job stages its run (`pitfalls.runner.staged`), so a slice stopped part-way leaves the earlier slices' results as
they were.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pitfalls.runner.job import INSTALLED_ENV
from pitfalls.runner.staged import StagedRun, run_staged
from pitfalls.runner.worktree import commit_of

__all__ = ["AsvSlice", "cuda_calibration_selection", "run_slice"]


@dataclass(frozen=True)
class AsvSlice:
    """One benchmark class of the suite, its cases on one device.

    Attributes:
        module: the benchmark module, e.g. "bench_loss".
        cls: the class, e.g. "Step".
        device_axis: whether the class sweeps devices (the Cuda and Nvml classes run on CUDA only and do not).
        mode_axis: whether it sweeps eager and compiled (on a CPU rehearsal only the eager cases run).
        cases: a pattern of the cases' names that replaces the class's own (e.g. the calibration table's CUDA rows,
            given lazily: it reads every check).
    """

    module: str
    cls: str
    device_axis: bool = True
    mode_axis: bool = True
    cases: Callable[[], str] | None = None

    @property
    def name(self) -> str:
        return f"asv {self.module}.{self.cls}"

    def selection(self, device: str) -> str:
        """The ``asv run -b`` pattern of this class's cases on ``device`` (asv matches it against each case's name
        with its parameters, ``bench_loss.Step.time_step('naive', 4, 64, 'cuda', 'eager')``)."""
        if self.cases is not None:
            return self.cases()
        pattern = rf"^{re.escape(self.module)}\.{re.escape(self.cls)}\.\w+"
        if not self.device_axis:
            return pattern
        pattern += rf"\(.*'{re.escape(device)}'"
        if device == "cpu" and self.mode_axis:
            pattern += r", 'eager'\)$"  # a CPU has minutes, not the compiles' hour: the rehearsal runs eagerly
        return pattern


def cuda_calibration_selection() -> str:
    """An asv ``-b`` pattern for the published errors of the calibration table's CUDA checks (and no other)."""
    from pitfalls.calibration.published import ERROR_METHOD
    from pitfalls.calibration.run import all_checks
    from pitfalls.known.table import CUDA

    names = "|".join(re.escape(repr(check.name)) for check in all_checks() if check.device == CUDA)
    return rf"^bench_calibration\.Error\w*\.{ERROR_METHOD}\(({names})\)$"


def run_slice(piece: AsvSlice, out: Path, device: str, machine: str, facts: dict[str, Any],
              root: Path) -> dict[str, Any]:
    """Run one slice and merge its results into ``out/results``.

    Args:
        piece: the class and its cases.
        out: the run's folder.
        device: "cuda" or "cpu".
        machine: the asv machine name the results go under.
        facts: the machine's hardware facts (`pitfalls.runner.machine.hardware`), read once by the run.
        root: the checkout (asv measures its HEAD commit).

    Returns:
        asv's exit status, the seconds, the selection, the files merged and the log's path.

    Raises:
        RuntimeError: no git checkout, or asv is missing (the slice cannot run here).
    """
    if shutil.which("git") is None or not (root / ".git").exists():
        raise RuntimeError(f"{root} is not a git checkout: asv measures a commit")
    (out / "results").mkdir(parents=True, exist_ok=True)
    log = out / "logs" / f"{piece.module}.{piece.cls}.log"
    log.parent.mkdir(exist_ok=True)
    selection = piece.selection(device)
    seconds = 0.0

    def launch(command: Sequence[str]) -> int:
        nonlocal seconds
        started = time.perf_counter()
        done = subprocess.run(list(command), cwd=root, capture_output=True, text=True, check=False)
        seconds = time.perf_counter() - started
        log.write_text(" ".join(command) + "\n" + done.stdout + done.stderr, encoding="utf-8")
        return done.returncode

    # A slice's stage is asv's scratch, inside the run's folder (the archive leaves ``.slice-*`` out).
    with tempfile.TemporaryDirectory(dir=out, prefix=".slice-") as scratch:
        args = ("-E", INSTALLED_ENV, "--set-commit-hash", commit_of(root), "--show-stderr", "-b", selection)
        done = run_staged(StagedRun(root, out / "results", Path(scratch), machine, args, facts), launch)
    return {"exit_code": done.status, "seconds": round(seconds, 1), "selection": selection,
            "merged": done.merged or [], "log": str(log.relative_to(out))}

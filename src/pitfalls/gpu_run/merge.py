"""A budgeted run brought home into the checkout (``scripts/gpu-run merge ARCHIVE``; docs/gpu.md, "Bringing a run
home")."""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from pitfalls.gpu_run.archive import unpack
from pitfalls.gpu_run.costs import RUN_COSTS, merge_costs
from pitfalls.proofs import FIGURES, LEDGER, ProofRun, read_proof

__all__ = ["KEPT", "MergeOptions", "merge_run"]

# The run's files kept under proof/ (the asv results go to results/, the logs stay in the archive).
KEPT = ("report.md", FIGURES, LEDGER, "plan.json", RUN_COSTS)


@dataclass(frozen=True)
class MergeOptions:
    """Where a run goes.

    Attributes:
        results: the asv results folder.
        proof: the folder of GPU runs' reports.
        costs: the committed cost file.
        config: asv.conf.json (for publishing the site).
        publish: republish the asv site after merging.
    """

    results: Path
    proof: Path
    costs: Path
    config: Path
    publish: bool = True


def _run_folder(source: Path, scratch: Path) -> Path:
    folder = source if source.is_dir() else unpack(source, scratch)
    missing = [name for name in (LEDGER, FIGURES) if not (folder / name).is_file()]
    if missing:
        raise ValueError(f"{source} is not a gpu-run folder or archive: no {', '.join(missing)}")
    return folder


def _proof_folder(proof: Path, run: ProofRun) -> Path:
    stem = f"{run.machine}-{run.facts.get('date', 'undated')}"
    folder, n = proof / stem, 2
    while folder.exists():
        folder, n = proof / f"{stem}-{n}", n + 1
    return folder


def merge_run(source: Path, options: MergeOptions) -> list[str]:
    """Bring a run (its archive, or its folder) into the checkout; returns what was done, a line each.

    Raises:
        ValueError: ``source`` is not a run; results or costs that cannot be merged (one line; nothing half-done
            is left in ``results/``: its merge replaces files by atomic renames under its lock).
    """
    from pitfalls.runner.conf import RunnerError
    from pitfalls.runner.merge import run_merge

    done: list[str] = []
    with tempfile.TemporaryDirectory(prefix="pitfalls-gpu-run-") as scratch:
        folder = _run_folder(source, Path(scratch))
        if (folder / "results" / "benchmarks.json").is_file():
            try:
                status = run_merge([str(folder / "results")], str(options.results), None, str(options.config),
                                   publish=options.publish)
            except RunnerError as error:
                raise ValueError(str(error)) from None
            if status != 0:
                raise ValueError(f"merging {folder / 'results'} into {options.results} failed (exit {status})")
            done.append(f"asv results merged into {options.results}" + (" and the site published" if
                                                                          options.publish else ""))
        else:
            done.append("no asv results in the run (no slice finished)")
        kept = _proof_folder(options.proof, read_proof(folder))
        kept.mkdir(parents=True)
        for name in KEPT:
            if (folder / name).is_file():
                shutil.copy2(folder / name, kept / name)
        done.append(f"report and figures kept in {kept}")
        changed = merge_costs(folder / RUN_COSTS, options.costs)
        done.append(f"{len(changed)} piece cost(s) recorded in {options.costs}")
    return done

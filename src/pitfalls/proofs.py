"""The one reader of ``proof/``: each GPU run's folder as one record, whichever command wrote it (docs/gpu.md,
"Reading proof/"): outcomes by piece name, one environment, every calibration row.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["CALIBRATION", "CORPUS", "FIGURES", "LEDGER", "ProofRun", "read_proof", "read_proofs"]

FIGURES = "figures.json"
LEDGER = "run.json"
CALIBRATE = "calibrate*.json"
# The pieces whose rows the docs' tables read.
CORPUS = "proof corpus"
CALIBRATION = "proof calibration cuda"
# A run's facts in its figures.json (the budgeted run's and the one-call proof's), beside the outcomes.
_FACTS = frozenset({"device", "machine", "kind", "budget_s", "date", "commit", "python", "hardware", "root", "seconds",
                    "pieces", "sizes", "environment"})
# The one-call proof's check keys, by the name of the budgeted run's piece that measures the same. Its calibration
# check ran the CUDA rows first, then the CPU ones: all of them are calibration rows.
_PIECE_OF = {"syncs": "proof syncs", "corpus": CORPUS, "gate": "proof gate", "nvml": "proof nvml",
             "timing": "proof timing", "speedups": "proof speedups", "scan_loader": "proof scan_loader",
             "loader step cost": "proof loader step cost", "calibration": CALIBRATION}


@dataclass(frozen=True)
class ProofRun:
    """One folder of ``proof/``.

    Attributes:
        name: its path under ``proof/`` (``h200-2026-12-04/loader``).
        facts: the run's facts (device, machine, date, commit, seconds...), empty when it has no figures.json.
        outcomes: each piece's outcome by the budgeted run's piece name: rows, a mapping, or ``{"skipped": why}``.
        ledger: a budgeted run's ledger (``run.json``'s pieces: name, status, seconds...), empty otherwise.
        calibrate_outputs: each ``pitfalls calibrate --json`` output of the folder: (file name, its rows).
    """

    name: str
    facts: Mapping[str, Any] = field(default_factory=dict)
    outcomes: Mapping[str, Any] = field(default_factory=dict)
    ledger: tuple[Mapping[str, Any], ...] = ()
    calibrate_outputs: tuple[tuple[str, tuple[Mapping[str, Any], ...]], ...] = ()

    @property
    def machine(self) -> str | None:
        """The machine a budgeted run names itself by (the one-call proof named none)."""
        return self.facts.get("machine")

    def rows(self, piece: str) -> list[dict[str, Any]]:
        """The rows of a piece that finished (its outcome's list, or its ``rows``); none when it did not."""
        outcome = self.outcomes.get(piece)
        if isinstance(outcome, Mapping):
            outcome = outcome.get("rows")
        return [dict(row) for row in outcome] if isinstance(outcome, list) else []

    def measured(self) -> list[str]:
        """The pieces with an outcome other than a skip (figures, an error, rows of a stopped piece), in order."""
        return [piece for piece, outcome in self.outcomes.items()
                if not (isinstance(outcome, Mapping) and set(outcome) == {"skipped"})]

    def environment(self) -> dict[str, Any]:
        """The machine and stack the run measured on (`pitfalls.probes.environment`'s facts: ``gpus``,
        ``cpu_count``, ``torch``, ``cuda``, ``driver``, ``commit``, ``python``...); empty when its files do not
        record them."""
        environment = self.facts.get("environment")
        if isinstance(environment, Mapping) and "torch" in environment:
            return dict(environment)
        hardware = self.facts.get("hardware")
        if not isinstance(hardware, Mapping):
            return {}
        return {**hardware, "cpu_count": hardware.get("cpu_usable"), "commit": self.facts.get("commit"),
                "python": self.facts.get("python")}

    def calibration_rows(self) -> dict[str, dict[str, Any]]:
        """Every calibration row of the folder by check name: its ``calibrate --json`` outputs, then its run's
        calibration piece."""
        rows = [row for _, output in self.calibrate_outputs for row in output] + self.rows(CALIBRATION)
        return {row["check"]: dict(row) for row in rows}

    def corpus_syncs(self) -> dict[str, Any]:
        """The real CUDA syncs per call of each construct of the scan corpus, by construct (none if not run)."""
        return {row["construct"]: row["cuda_syncs"] for row in self.rows(CORPUS)}


def _json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def read_proof(folder: Path, name: str | None = None) -> ProofRun:
    """One folder: a budgeted run's (kept under ``proof/``, or as the run wrote it), or the one-call proof's.

    Args:
        folder: the folder.
        name: what to call it (default: the folder's own name).
    """
    figures = _json(folder / FIGURES) if (folder / FIGURES).is_file() else {}
    facts = {key: value for key, value in figures.items() if key in _FACTS}
    outcomes = {_PIECE_OF.get(key, key): value for key, value in figures.items() if key not in _FACTS}
    ledger = tuple(_json(folder / LEDGER)["pieces"]) if (folder / LEDGER).is_file() else ()
    outputs = tuple((path.name, tuple(_json(path))) for path in sorted(folder.glob(CALIBRATE)))
    return ProofRun(folder.name if name is None else name, facts, outcomes, ledger, outputs)


def read_proofs(proof: Path) -> list[ProofRun]:
    """Every folder under ``proof`` that holds a GPU run's figures, ledger or calibration output, by path.

    Args:
        proof: the ``proof/`` folder (missing: no runs).
    """
    folders = {path.parent for pattern in (FIGURES, LEDGER, CALIBRATE) for path in proof.glob(f"**/{pattern}")}
    return [read_proof(folder, folder.relative_to(proof).as_posix()) for folder in sorted(folders)]

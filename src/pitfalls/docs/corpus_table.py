"""The sync-hazard corpus table: each construct's label, the CPU scan's count now, and the real CUDA syncs that
every committed GPU run counted for it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pitfalls.markdown import code, table
from pitfalls.proofs import read_proofs
from pitfalls.scan_corpus import CORPUS, HELPER, counted_line, expected_per_line, scan_per_line

__all__ = ["corpus_lines"]


def _count(value: Any) -> str:
    return f"{value:g}" if isinstance(value, (int, float)) else str(value)


def corpus_lines(proof: Path) -> list[str]:
    """One line per construct: its code, its label, the CPU scan's count (run now), each GPU run's real syncs."""
    labels = expected_per_line()
    scanned, _ = scan_per_line("cpu")
    # Each committed GPU run's real syncs per construct: its folder -> construct name -> syncs per call.
    gpu = {run.name: syncs for run in read_proofs(proof) if (syncs := run.corpus_syncs())}
    body = []
    for construct in (*CORPUS, HELPER):
        line = counted_line(construct)
        shown = (f"{code(construct.name)}: a helper `return mask.nonzero()` called from two lines"
                 if construct is HELPER else code(construct.code))
        body.append((shown, labels[line], _count(scanned.get(line, 0)),
                     *(_count(runs.get(construct.name, "not run there")) for runs in gpu.values())))
    header = ("construct (one line, every tensor on one device)", "syncs per call on CUDA (label)",
              "CPU scan", *(f"real CUDA syncs, `proof/{f}`" for f in gpu))
    return table(header, body)

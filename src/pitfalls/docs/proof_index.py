"""The index of ``proof/``: one line per committed GPU run's folder, its machine, its stack and what it holds, read
through `pitfalls.proofs` (the budgeted run's folders and the one-call proof's alike)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from pitfalls.markdown import code, link, table
from pitfalls.proofs import ProofRun, read_proofs

__all__ = ["proof_lines"]


def _holds(run: ProofRun) -> str:
    held = []
    if run.facts or run.outcomes:
        done = run.measured()
        held.append("figures of " + ", ".join(done) if done else "no figures")
    if run.ledger:
        counted = Counter(piece["status"] for piece in run.ledger)
        held.append("a budgeted run: " + ", ".join(f"{n} {status}" for status, n in counted.items()))
    for name, rows in run.calibrate_outputs:
        verdicts = Counter(row["verdict"] for row in rows)
        held.append(f"{code(name)}: {len(rows)} calibration rows, "
                    + ", ".join(f"{n} {verdict}" for verdict, n in verdicts.items()))
    return "; ".join(held)


def _environment(run: ProofRun) -> list[str]:
    env = run.environment()
    if not env:
        return ["not recorded in its files"] + ["-"] * 3
    gpus = ", ".join(g["name"] for g in env.get("gpus", ())) if isinstance(env.get("gpus"), list) else "-"
    return [f"{gpus or '-'} ({env.get('cpu_count', '?')} cores)", f"{env.get('torch')}, CUDA {env.get('cuda')}, "
            f"driver {env.get('driver')}", code(str(env.get("commit", "?"))[:7]), f"Python {env.get('python')}"]


def proof_lines(root: Path, page: Path) -> list[str]:
    """One line per folder of ``proof/`` that holds a GPU run's outputs: the machine, the stack, what it holds.

    Args:
        root: the repository's root.
        page: the page the table is on (its links are relative to it).
    """
    runs = read_proofs(root / "proof")
    if not runs:
        return ["No GPU run is committed yet."]
    return table(("folder", "GPU", "torch", "suite commit", "Python", "holds"),
                 ((link(code(f"proof/{run.name}"), Path("proof") / run.name, page), *_environment(run), _holds(run))
                  for run in runs))

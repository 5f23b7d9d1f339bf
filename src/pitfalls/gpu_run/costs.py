"""What each piece of the budgeted run costs, in seconds, per device kind: read from a committed file, written back
from runs (docs/gpu.md, "Costs")."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pitfalls.checkout import ROOT
from pitfalls.gpu_run.outcome import write_json
from pitfalls.gpu_run.plan import STOPPED, Entry, Piece

__all__ = ["COSTS", "HEADROOM", "RUN_COSTS", "Costs", "merge_costs", "run_costs"]

# The committed cost file.
COSTS = ROOT / "proof" / "costs.json"

# A recorded cost is a single run's seconds: the schedule expects a little more, so that an ordinary slower run
# is not stopped at the budget's edge.
HEADROOM = 1.2
# The run's own record of what its pieces took, in its output folder.
RUN_COSTS = "costs.json"


class Costs:
    """The recorded seconds of every piece, per device kind.

    Args:
        recorded: kind -> piece name -> seconds.
    """

    def __init__(self, recorded: Mapping[str, Mapping[str, float]] | None = None) -> None:
        self.recorded = {kind: dict(pieces) for kind, pieces in (recorded or {}).items()}

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> Costs:
        """The cost file at ``path`` (no file: nothing recorded).

        Raises:
            ValueError: the file is not a cost file (one line naming it).
        """
        file = Path(path)
        if not file.exists():
            return cls()
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
            kinds = data["kinds"]
            return cls({str(kind): {str(name): float(s) for name, s in pieces.items()}
                        for kind, pieces in kinds.items()})
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise ValueError(f"{file} is not a cost file ({{\"kinds\": {{KIND: {{PIECE: SECONDS}}}}}}): "
                             f"{type(error).__name__}: {error}") from None

    def cost(self, piece: Piece, kind: str, device: str) -> tuple[float, str]:
        """The seconds to expect of ``piece`` on ``kind`` (recorded, with `HEADROOM`), else its guess for ``device``.

        Returns:
            (seconds, where they came from).
        """
        seconds = self.recorded.get(kind, {}).get(piece.name)
        if seconds is not None:
            return seconds * HEADROOM, f"recorded on {kind}"
        device_type = device.split(":")[0]
        if device_type not in piece.guess_s:
            raise ValueError(f"piece {piece.name!r} has no guess for device {device!r}; it has: "
                             f"{', '.join(piece.guess_s)}")
        return float(piece.guess_s[device_type]), "guess"

    def write(self, path: str | os.PathLike[str]) -> None:
        """Write the file (sorted, whole, renamed into place)."""
        write_json(Path(path), {
            "about": "seconds each piece of scripts/gpu-run took, per device kind, as the last run that finished it "
                     "measured (merged by `scripts/gpu-run merge`, never written by hand)",
            "kinds": {kind: dict(sorted(pieces.items())) for kind, pieces in sorted(self.recorded.items())}})


def run_costs(kind: str, entries: Iterable[Entry]) -> dict[str, Any]:
    """A run's own record of what its pieces took: done and failed pieces as measured; a piece the budget stopped
    as at least the seconds it ran (it needs more)."""
    return {"kind": kind, "pieces": {
        entry.name: {"seconds": round(entry.seconds, 1), "status": entry.status,
                     **({"at_least": True} if entry.status == STOPPED else {})}
        for entry in entries if entry.started}}


def merge_costs(run_file: str | os.PathLike[str], cost_file: str | os.PathLike[str]) -> list[str]:
    """Fold a run's ``costs.json`` into the cost file: a measured cost replaces the recorded one; a stopped piece's
    seconds replace it only when larger (they are a lower bound).

    Returns:
        The names of the pieces whose cost changed.

    Raises:
        ValueError: either file is not what it should be (one line).
    """
    try:
        run = json.loads(Path(run_file).read_text(encoding="utf-8"))
        kind, pieces = str(run["kind"]), dict(run["pieces"])
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{run_file} is not a run's {RUN_COSTS}: {type(error).__name__}: {error}") from None
    costs = Costs.read(cost_file)
    recorded = costs.recorded.setdefault(kind, {})
    changed = []
    for name, took in pieces.items():
        seconds = float(took["seconds"])
        if took.get("at_least") and recorded.get(name, 0.0) >= seconds:
            continue
        if recorded.get(name) != seconds:
            recorded[name] = seconds
            changed.append(name)
    costs.write(cost_file)
    return changed

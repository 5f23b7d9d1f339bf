"""`scan-loader` on a device for ``scripts/gpu-run``'s ``proof scan_loader`` piece: the parts that need CUDA (pinning,
the copy to the GPU)."""

from __future__ import annotations

from typing import Any

import torch

from pitfalls.family import SkipCase
from pitfalls.scan_loader.scan import ScanOptions, scan_loader

__all__ = ["pinned_against_unpinned"]

PROOF_BUDGET_S = 30.0


def pinned_against_unpinned(device: str, _sizes: Any = None) -> list[dict[str, Any]]:
    """Scan the loader family's ``naive`` variant at workers 0 and 1, pin_memory off and on where CUDA is.

    Args:
        device: "cuda" for the proof (pinning timed); "cpu" for a rehearsal (pinning reads n/a with the reason).

    Returns:
        One row per setting: samples/s, wait share, verdict, batches timed, or why it was skipped.
    """
    from pitfalls.families.loader import FAMILY, make_step

    try:
        where, params = FAMILY.place("naive", device, {**FAMILY.smoke, "num_workers": 0})
        built = make_step("naive", where, params, start=False)
    except SkipCase as skip:
        return [{"setting": "all", "skipped": skip.reason}]
    loader = getattr(built, "loader", None)
    if loader is None:
        built.close()
        return [{"setting": "all", "skipped": "the loader family's naive step holds no DataLoader"}]
    try:
        report = scan_loader(loader, None, ScanOptions(device=torch.device(where), workers=(0, 1),
                                                       budget_s=PROOF_BUDGET_S), target="loader/naive")
    finally:
        built.close()
    rows: list[dict[str, Any]] = []
    for result in report.settings:
        row: dict[str, Any] = {"setting": result.setting.label}
        if result.steady is None or result.bound is None:
            row["skipped"] = result.skipped
        else:
            row.update(samples_per_s=round(result.steady.samples_per_second, 1),
                       wait_share=round(result.steady.wait_share, 3), verdict=result.bound.verdict,
                       batches=result.steady.batches)
        rows.append(row)
    if where.type != "cuda":
        rows.append({"setting": "pin=on", "skipped": "n/a: pin_memory needs a CUDA device"})
    return rows

"""Real CUDA syncs on the device against what the suite counts without one: every case's sync hazards, count for
count, and the scan corpus line by line. Off a GPU the real syncs read "unavailable: <reason>".
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from pitfalls import scan_corpus
from pitfalls.devices import synchronize
from pitfalls.family import HAZARDS
from pitfalls.gpu_run.checks import build_or_skip
from pitfalls.gpu_run.outcome import piece_rows, render_rows, value
from pitfalls.gpu_run.sizes import Sizes
from pitfalls.probes import HazardCounts, Unavailable, count_cuda_syncs, count_hazards
from pitfalls.registry import all_families

__all__ = ["SYNCS_PER_HAZARD", "expected_syncs", "render_corpus", "scan_corpus_on_device",
           "syncs_agree", "syncs_against_hazards"]

# Real CUDA syncs per hazard of a label, where one hazard is not exactly one sync (every other label: one).
# A row agrees when its real syncs per call equal the sum over its hazards of these counts.
SYNCS_PER_HAZARD: dict[str, int] = {}


def expected_syncs(hazards: HazardCounts) -> int:
    """The real CUDA syncs one call should show for its hazards: one each, or the label's `SYNCS_PER_HAZARD`."""
    return sum(count * SYNCS_PER_HAZARD.get(label, 1) for label, count in hazards.counts)


def syncs_agree(hazards: HazardCounts, real: float | Unavailable) -> str:
    """"yes" when the real syncs per call equal the hazards count for count, "NO" when not, "n/a" unmeasured."""
    if isinstance(real, Unavailable):
        return "n/a"
    return "yes" if abs(real - expected_syncs(hazards)) < 1e-9 else "NO"


def syncs_against_hazards(device: str, _sizes: Sizes) -> list[dict[str, Any]]:
    """For every variant and floor: sync hazards of the eager program and real CUDA syncs, per call, count for count.

    The counts do not depend on size, only on the code path, so every family is counted at its smoke size.
    """
    rows = piece_rows()
    for entry in all_families().values():
        if HAZARDS not in entry.figures:
            continue
        for variant in entry.cases:
            case = build_or_skip(entry, variant, device, entry.smoke, rows)
            if case is None:
                continue
            with case:
                case()
                synchronize(case.device)
                hazards = count_hazards(case)
                syncs = count_cuda_syncs(case, calls=5, warmup=1)
            real: float | Unavailable = syncs if isinstance(syncs, Unavailable) else syncs.per_call
            rows.append(
                {"family": entry.name, "variant": variant, "sizes": dict(entry.smoke), "sync_hazards": hazards.total,
                 "by_op": hazards.as_dict(), "expected_syncs": expected_syncs(hazards), "cuda_syncs": value(real),
                 "count_for_count": syncs_agree(hazards, real)}
            )
    return rows


def _agreement(counted: Mapping[tuple[str, int], float], truth: Mapping[tuple[str, int], float]) -> str:
    found = scan_corpus.agreement(counted, truth)
    return f"precision {found.precision:.3g}, recall {found.recall:.3g}, {len(found.wrong)} lines differ"


def scan_corpus_on_device(device: str, _sizes: Sizes) -> dict[str, Any]:
    """The scan corpus: each construct's label, the CPU scan's count, the scan on the device, and real CUDA syncs
    counted by PyTorch's sync debug mode, per call; then how each agrees with the real syncs, line by line. A
    construct that needs CUDA reads "skipped on cpu: <why>" in the CPU scan's column and is left out of the CPU
    comparisons."""
    labels = scan_corpus.expected_per_line()
    cpu_scan, _ = scan_corpus.scan_per_line("cpu")
    device_scan, _ = scan_corpus.scan_per_line(device)
    d = scan_corpus.corpus_data(device)
    rows: list[dict[str, Any]] = []
    real: dict[tuple[str, int], float] = {}
    missing: Unavailable | None = None
    for construct in (*scan_corpus.CORPUS, scan_corpus.HELPER):
        line = scan_corpus.counted_line(construct)
        skipped = {where: f"skipped on {where}: {construct.needs_cuda}" for where in ("cpu", device)
                   if not scan_corpus.runs_on(construct, where)}
        if device in skipped:
            counted: Any = Unavailable(skipped[device])
        else:
            counted = count_cuda_syncs(functools.partial(construct.run, d), calls=3, warmup=1)
        if isinstance(counted, Unavailable):
            missing = missing or (None if device in skipped else counted)
        else:
            real[line] = counted.per_call
        rows.append(
            {"construct": construct.name, "code": f"`{construct.code}`", "label": labels[line],
             "cpu_scan": skipped.get("cpu", cpu_scan.get(line, 0)),
             f"{device}_scan": skipped.get(device, device_scan.get(line, 0)),
             "cuda_syncs": value(counted if isinstance(counted, Unavailable) else counted.per_call)}
        )
    cpu_labels = scan_corpus.expected_per_line("cpu")
    summary = {
        "cpu scan against labels": _agreement(cpu_scan, cpu_labels),
        f"{device} scan against cpu scan": _agreement(
            {line: n for line, n in device_scan.items() if line in cpu_labels}, cpu_scan),
    }
    if missing is not None:
        summary["against real CUDA syncs"] = value(missing)
    else:
        summary["cpu scan against real CUDA syncs"] = _agreement(
            cpu_scan, {line: n for line, n in real.items() if line in cpu_labels})
        summary["labels against real CUDA syncs"] = _agreement(labels, real)
    return {"rows": rows, "agreement": summary}


def render_corpus(found: dict[str, Any]) -> str:
    """The scan corpus piece: its agreement summary, then its rows."""
    agreement = [{"check": k, "agreement": v} for k, v in found["agreement"].items()]
    return render_rows(agreement) + "\n" + render_rows(found["rows"])

"""The articles' claims table: its verdict rule, a planted GPU run's headlines read at the articles' sizes, and the
README's copy generated from the committed results (HEAD's results/ and proof/: a stale copy fails)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from pitfalls.report import claims
from pitfalls.report.claims import CLAIMS, Reading, Source, claims_markdown, machine_sources, verdict

ROOT = Path(__file__).resolve().parents[1]


def test_the_readme_table_is_what_the_committed_results_give(committed_inputs: Path) -> None:
    text = (ROOT / "README.md").read_text()
    block = text[text.index(claims.MARK_BEGIN):text.index(claims.MARK_END) + len(claims.MARK_END)]
    assert block == claims.readme_block(committed_inputs / "results", committed_inputs / "proof"), (
        "README's claims table is not what HEAD's results/ and proof/ give: run `python -m pitfalls.docs --write` "
        "and commit the README with the results and proofs it is generated from")


def _claim(ratio: tuple[float, float] | None, faster: bool = True) -> claims.Claim:
    return claims.Claim("000", "planted", "A10G", ratio, faster, lambda source: None)


@pytest.mark.parametrize(("ratio", "faster", "measured", "expected"), [
    ((240, 240), True, (130.0,), "reproduced"),      # within 2x
    ((240, 240), True, (1.05,), "partly"),           # the article's way, far from it
    ((240, 240), True, (0.9,), "not reproduced"),    # the other way
    ((2, 52), True, (1.5, 30.0), "reproduced"),      # each end within 2x of the article's end
    ((2, 52), True, (1.5, 10.0), "partly"),
    ((1, 1), False, (0.6, 0.9), "reproduced"),       # "at best even": not faster, near even
    ((1, 1), False, (0.3, 0.45), "partly"),
    ((1, 1), False, (0.8, 1.4), "not reproduced"),   # faster at some N: against "at best even"
    (None, True, (3.0,), "reproduced"),              # a claim of direction only
])
def test_the_verdict_rule(ratio: tuple[float, float] | None, faster: bool, measured: tuple[float, ...],
                          expected: str) -> None:
    assert verdict(_claim(ratio, faster), Reading(measured, "x", True)) == expected


def test_no_verdict_off_the_articles_sizes_or_without_a_figure() -> None:
    claim = _claim((240, 240))
    assert verdict(claim, Reading((200.0,), "x", False)) == "not measured at the article's size"
    assert verdict(claim, None) == "not measured yet"


def _planted_run(machine: str) -> dict[str, Any]:
    """A budgeted run's figures as its headline pieces write them, with planted numbers."""
    loss = [{"family": "loss", "variant": v, "compiled": False, "sizes": {"batch": 256, "image_size": 256},
             "naive_ms": 210.0, "variant_ms": ms, "speedup": round(210.0 / ms, 3), "naive_sync_hazards": 6,
             "naive_cuda_syncs": 6.0, "naive_busy_pct": 99.1, "variant_busy_pct": 99.4}
            for v, ms in (("where", 209.0), ("ignore_index", 205.0))]
    eager = [{"family": "sampler", "variant": "static", "compiled": False, "sizes": {"n": n, "batch": 1},
              "naive_ms": 0.3, "variant_ms": 0.3 / r, "speedup": r, "naive_sync_hazards": 2, "naive_cuda_syncs": 2.0}
             for n, r in ((1000, 0.8), (10_000, 0.9), (100_000, 0.95), (1_000_000, 1.1), (10_000_000, 3.0))]
    loader = [{"family": "loader", "variant": v, "sizes": {"image_size": 512, "batch": 32, "num_workers": 8,
                                                            "image_format": "jpeg"},
               "bytes_per_batch": b, "batches_in_flight": 16, "bytes_in_flight": 16 * b}
              for v, b in (("naive", 167_772_160), ("uint8", 33_554_432))]
    return {"machine": machine, "device": "cuda", "date": "2026-12-05", "headline loss": loss,
            "headline sampler eager": eager, "headline loader": loader,
            "headline parallel": [{"variant": "data_parallel", "skipped": "needs 2 or more CUDA devices"}]}


def test_a_gpu_run_fills_its_column_with_verdicts_at_the_articles_sizes(tmp_path: Path,
                                                                       committed_inputs: Path) -> None:
    shutil.copytree(committed_inputs / "results", tmp_path / "results")
    (tmp_path / "proof" / "gpu-nvidia-h200-2026-12-05").mkdir(parents=True)
    (tmp_path / "proof" / "gpu-nvidia-h200-2026-12-05" / "figures.json").write_text(
        json.dumps(_planted_run("gpu-nvidia-h200")))
    sources = machine_sources(tmp_path / "results", tmp_path / "proof")
    assert [s.machine for s in sources][-1] == "gpu-nvidia-h200"
    gpu = sources[-1]
    readings = {claim.text.split(":")[0]: (claim.read(gpu), claim) for claim in CLAIMS}
    loss, loss_claim = readings["Removing the loss's syncs"]
    assert loss is not None and loss.ratios == (round(210 / 205, 3),) and verdict(loss_claim, loss) == "partly"
    assert "6 syncs a step" in loss.reason and "99.1 % busy" in loss.reason
    eager, eager_claim = next(v for k, v in readings.items() if k.startswith("Eagerly"))
    # N = 1e3..1e6 only (the article's range for this claim): 1.1x at 1e6 is faster, against "at best even".
    assert eager is not None and eager.ratios == (0.8, 0.9, 0.95, 1.1)
    assert verdict(eager_claim, eager) == "not reproduced"
    size, size_claim = next(v for k, v in readings.items() if k.startswith("uint8"))
    assert size is not None and size.ratios == (5.0,) and verdict(size_claim, size) == "reproduced"
    parallel, _ = next(v for k, v in readings.items() if k.startswith("DataParallel"))
    assert parallel is None  # skipped on one GPU: not measured, never a verdict
    table = claims_markdown(sources)
    assert "| GPU |" not in table.splitlines()[0]  # the GPU machine's own column replaces the placeholder
    assert "gpu-nvidia-h200" in table.splitlines()[0]


def test_without_a_gpu_run_the_gpu_column_says_not_measured_yet(tmp_path: Path) -> None:
    sources = [Source("cpu-x")]
    lines = claims_markdown(sources).splitlines()
    assert lines[0].split(" | ")[-2] == "GPU"
    assert all(line.split(" | ")[-2] == "**not measured yet**" for line in lines[2:])
    assert len(lines) == 2 + len(CLAIMS)

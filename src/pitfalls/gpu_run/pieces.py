"""Every piece of the budgeted run, in its fixed priority order (docs/gpu.md lists them), and what each measures.

A piece runs in a process of its own (``python -m pitfalls.gpu_run piece NAME``) and writes its outcome into
``OUT/pieces/<name>.json`` as it goes.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pitfalls.gpu_run import checks, headlines, syncs
from pitfalls.gpu_run.outcome import attempt, is_failure, write_json
from pitfalls.gpu_run.plan import Piece
from pitfalls.gpu_run.sizes import ON_GPU, REHEARSAL, Sizes
from pitfalls.gpu_run.slices import AsvSlice, cuda_calibration_selection, run_slice
from pitfalls.scan_loader.proof import pinned_against_unpinned

__all__ = ["CATALOGUE", "FACTS", "PIECES", "Context", "outcome_of", "piece_file", "run_piece"]

# The run's facts, read once by the run and handed to its pieces: machine, kind, hardware, checkout.
FACTS = "run-facts.json"


@dataclass(frozen=True)
class Context:
    """What a piece needs to know of its run.

    Attributes:
        out: the run's folder.
        device: "cuda" or "cpu".
        machine: the asv machine name.
        facts: the machine's hardware facts.
        root: the checkout measured.
    """

    out: Path
    device: str
    machine: str
    facts: dict[str, Any]
    root: Path

    @classmethod
    def read(cls, out: Path) -> Context:
        data = json.loads((out / FACTS).read_text(encoding="utf-8"))
        return cls(out, data["device"], data["machine"], data["hardware"], Path(data["root"]))

    @property
    def sizes(self) -> Sizes:
        """The articles' sizes on CUDA, the rehearsal's elsewhere."""
        return ON_GPU if self.device == "cuda" else REHEARSAL


Measure = Callable[[Context], Any]


def _slice(piece: AsvSlice) -> Measure:
    return lambda ctx: run_slice(piece, ctx.out, ctx.device, ctx.machine, ctx.facts, ctx.root)


def _on_device(measure: Callable[[str, Sizes], Any]) -> Measure:
    return lambda ctx: measure(ctx.device, ctx.sizes)


def _doctor(ctx: Context) -> dict[str, Any]:
    """`pitfalls doctor` on its planted training script on the device (`pitfalls.gpu_run.doctor`)."""
    from pitfalls.gpu_run.doctor import gpu_check

    return gpu_check(ctx.out / "doctor", ctx.device)


def _slices(group: int, family_slices: tuple[AsvSlice, ...], cuda_s: float,
            cpu_s: float) -> list[tuple[Piece, Measure]]:
    return [(Piece(s.name, group, f"asv: {s.module}.{s.cls} on the device", {"cuda": cuda_s, "cpu": cpu_s}),
             _slice(s)) for s in family_slices]


_LOSS_SAMPLER = tuple(
    AsvSlice(f"bench_{fam}", cls, device_axis=cls not in ("Cuda", "Nvml"), mode_axis=cls != "SyncHazards")
    for fam, time_class in (("loss", "Step"), ("sampler", "Sample"))
    for cls in ("Cuda", "Nvml", time_class, "Speedup", "SyncHazards"))
_COMPILE = (AsvSlice("bench_loss", "Compile", mode_axis=False), AsvSlice("bench_sampler", "Compile", mode_axis=False))
_LOADER = tuple(AsvSlice("bench_loader", cls, device_axis=cls not in ("Cuda", "Nvml"), mode_axis=False)
                for cls in ("Cuda", "Nvml", "Batch", "Speedup", "Throughput"))
_PARALLEL = tuple(AsvSlice("bench_parallel", cls, mode_axis=False) for cls in ("Step", "Speedup", "Ranks"))
# The calibration family's planted cases on the device, and the calibration table's CUDA rows as the site
# publishes them.
_CALIBRATION = (*(AsvSlice("bench_calibration", cls, mode_axis=False) for cls in ("Call", "Speedup", "SyncHazards")),
                AsvSlice("bench_calibration", "Error", device_axis=False, mode_axis=False,
                         cases=cuda_calibration_selection))

# The guesses are on the high side for a first run on a new kind (docs/gpu.md, "Costs"): a piece left out is
# cheaper than one stopped half-way.
_CATALOGUE: list[tuple[Piece, Measure]] = [
    *_slices(1, _LOSS_SAMPLER, cuda_s=90, cpu_s=60),
    *_slices(1, _COMPILE, cuda_s=420, cpu_s=300),
    (Piece("headline loss", 2, "article 000: each loss variant against naive, a training step at the article's size",
           {"cuda": 150, "cpu": 30}), _on_device(headlines.loss)),
    (Piece("headline sampler eager", 2, "article 004: static against nonzero, eager, one row per call at each N",
           {"cuda": 90, "cpu": 30}), _on_device(functools.partial(headlines.sampler, batched=False, compiled=False))),
    (Piece("headline sampler compiled", 2, "article 004: compiled static against nonzero, one row per call at each N",
           {"cuda": 300, "cpu": 90}), _on_device(functools.partial(headlines.sampler, batched=False, compiled=True))),
    (Piece("headline sampler batched", 2, "article 004: one static call over a batch of rows against a loop, at each N",
           {"cuda": 120, "cpu": 30}), _on_device(functools.partial(headlines.sampler, batched=True, compiled=False))),
    (Piece("headline sampler batched compiled", 2, "article 004: the same with static compiled",
           {"cuda": 300, "cpu": 120}), _on_device(functools.partial(headlines.sampler, batched=True, compiled=True))),
    (Piece("headline loader", 2, "article 001: naive against uint8 at the article's batch and workers",
           {"cuda": 150, "cpu": 60}), _on_device(headlines.loader)),
    (Piece("headline parallel", 2, "article 001: DataParallel against DDP at the article's size",
           {"cuda": 90, "cpu": 60}), _on_device(headlines.parallel)),
    *_slices(3, _LOADER, cuda_s=150, cpu_s=90),
    (Piece("parallel largest batch", 3, "parallel: the largest global batch each variant fits, bounded",
           {"cuda": checks.LARGEST_BATCH_S + 60, "cpu": 15}), _on_device(checks.largest_batches)),
    *_slices(3, _PARALLEL, cuda_s=120, cpu_s=120),
    (Piece("proof gate", 4, "every variant against naive on the device (pitfalls check)", {"cuda": 30, "cpu": 60}),
     _on_device(checks.gate)),
    (Piece("proof syncs", 4, "real CUDA syncs against sync hazards, per call", {"cuda": 45, "cpu": 30}),
     _on_device(syncs.syncs_against_hazards)),
    (Piece("proof corpus", 4, "the scan corpus: labels, the scan and real CUDA syncs per line",
           {"cuda": 30, "cpu": 30}), _on_device(syncs.scan_corpus_on_device)),
    (Piece("proof nvml", 4, "NVML while each case loops", {"cuda": 120, "cpu": 60}),
     _on_device(checks.nvml_while_looping)),
    (Piece("proof timing", 4, "CUDA-event time against host time", {"cuda": 45, "cpu": 30}),
     _on_device(checks.event_against_host_time)),
    (Piece("proof scan_loader", 4, "scan-loader: pin_memory off and on", {"cuda": 30, "cpu": 30}),
     _on_device(pinned_against_unpinned)),
    (Piece("proof loader step cost", 4, "the loader's model_ms step, planted against measured, and its verdict",
           {"cuda": 30, "cpu": 30}), _on_device(checks.loader_step_cost)),
    # Its CUDA rows include the doctor's rules on a device: one doctor run of the planted rules script, 20-30 s.
    (Piece("proof calibration cuda", 4, "the calibration table's CUDA rows", {"cuda": 90, "cpu": 15}),
     _on_device(checks.calibration_cuda_rows)),
    (Piece("doctor", 4, "pitfalls doctor on its planted script: real syncs per line, their stalls, copy bandwidth",
           {"cuda": 90, "cpu": 60}), _doctor),
    *_slices(4, _CALIBRATION, cuda_s=60, cpu_s=30),
    # The H200's one-call proof stopped its speedups after 170 s: last, where a budget that has room takes it.
    (Piece("proof speedups", 4, "every variant and floor against naive, interleaved, at each family's sizes",
           {"cuda": 300, "cpu": 120}), _on_device(checks.speedups)),
]
PIECES: tuple[Piece, ...] = tuple(piece for piece, _ in _CATALOGUE)
CATALOGUE: Mapping[str, tuple[Piece, Measure]] = {piece.name: (piece, measure) for piece, measure in _CATALOGUE}


def piece_file(out: Path, name: str, folder: str = "pieces", suffix: str = ".json") -> Path:
    """Where a piece writes its outcome (or, in ``logs``, its log)."""
    return out / folder / (name.replace(" ", "_").replace("/", "_") + suffix)


def outcome_of(out: Path, name: str) -> Any:
    """What a piece wrote (its rows so far, when it was stopped), or None if it wrote nothing."""
    path = piece_file(out, name)
    if not path.is_file():
        return None
    return json.loads(path.read_text(encoding="utf-8"))["outcome"]


# The column of a piece's rows that says "NO" where the proof finds what it exists to catch: a variant whose real
# syncs differ from its hazards, or whose answer differs from naive's. Such a row fails the piece.
_VERDICTS = {"proof syncs": "count_for_count", "proof gate": "matches_naive"}


def run_piece(name: str, out: Path) -> int:
    """Run one piece of the run in ``out`` (this process is its own); returns 0, or 1 when it raised, an asv case
    failed, or a row of its says "NO" (`_VERDICTS`).

    Raises:
        ValueError: no such piece.
    """
    if name not in CATALOGUE:
        raise ValueError(f"no such piece {name!r}; pieces: {', '.join(CATALOGUE)}")
    _, measure = CATALOGUE[name]
    context = Context.read(out)
    path = piece_file(out, name)
    path.parent.mkdir(parents=True, exist_ok=True)

    figures: dict[str, Any] = {}
    attempt(figures, name, functools.partial(measure, context),
            lambda figures: write_json(path, {"name": name, "outcome": figures[name]}))
    outcome = figures[name]
    if is_failure(outcome):
        return 1
    if isinstance(outcome, dict) and outcome.get("exit_code") not in (None, 0):
        return 1  # an asv slice in which a case failed: its results are merged, the piece is not done
    column = _VERDICTS.get(name)
    return 1 if column and isinstance(outcome, list) and any(row.get(column) == "NO" for row in outcome) else 0

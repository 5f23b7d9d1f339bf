"""One command that proves the suite's GPU claims on any CUDA machine, in minutes, without a network.

It measures, on the device, what a CPU machine can only reason about: real host-device syncs against the sync
hazards counted on the eager program, NVML's view of the GPU while each case loops, CUDA-event time
against host time, the article's headline ratio (naive / ignore_index loss at batch 256, 256x256), and the asv
quick grid's CUDA cases. Everything goes into a folder: ``report.md``, ``figures.json`` and asv's results.

``--device cpu`` runs the same script on a CPU machine with small sizes, so its report logic is tested where
there is no GPU; every GPU-only figure then reads "unavailable: <reason>".
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from pitfalls import measure, runner, scan_corpus
from pitfalls.checkout import ROOT
from pitfalls.devices import cuda_available, synchronize
from pitfalls.equivalence import check_all
from pitfalls.families.parallel import entry as parallel
from pitfalls.families.parallel import memory
from pitfalls.family import HAZARDS, NVML, SPEEDUP, Case, Family, SkipCase
from pitfalls.measure import nvml_window
from pitfalls.probes import (
    HazardCounts,
    NvmlSummary,
    Unavailable,
    count_cuda_syncs,
    count_hazards,
    cuda_event_time,
    environment_facts,
    wall_time,
)
from pitfalls.probes.timing import BLOCKED_SECONDS
from pitfalls.registry import all_families
from pitfalls.runner.job import INSTALLED_ENV
from pitfalls.runner.worktree import head_commit
from pitfalls.scan_loader.proof import pinned_against_unpinned
from pitfalls_asv_main import atomic_write
from pitfalls_asv_main import command as asv_command


@dataclass(frozen=True)
class Sizes:
    """How a proof run sizes its cases: the article's sizes on a GPU, every family's smoke size for a dry run.

    Attributes:
        article: use each family's ``article_sizes`` for NVML and speedups (else its smoke size).
        nvml_seconds: seconds each case loops while NVML samples.
        rounds: interleaved rounds of each speedup (block pairs at least, for cases with workers or ranks).
        speedup_seconds: seconds a speedup of cases with workers or ranks keeps timing block pairs past ``rounds``.
        host_seconds: seconds the host timer times each case against its CUDA events (at least).
    """

    article: bool
    nvml_seconds: float
    rounds: int
    speedup_seconds: float = BLOCKED_SECONDS
    host_seconds: float = 0.5

    def of(self, entry: Family) -> tuple[dict[str, Any], ...]:
        """The sizes to measure a family at."""
        sizes = entry.article_sizes if self.article and entry.article_sizes else (entry.smoke,)
        return tuple(dict(s) for s in sizes)


GPU_SIZES = Sizes(article=True, nvml_seconds=3.0, rounds=10)
# A dry run shows that every section runs and writes its figures: its speedups take their rounds and no more, and
# its host times (no CUDA events to hold them against) a few calls.
DRY_RUN_SIZES = Sizes(article=False, nvml_seconds=0.2, rounds=3, speedup_seconds=0.0, host_seconds=0.05)


def _value(figure: Any) -> Any:
    """A JSON-able figure: the number, or ``"unavailable: <reason>"``."""
    return str(figure) if isinstance(figure, Unavailable) else figure


class _LiveRows(list):
    """A check's rows that hand themselves to ``on_row`` after each new one: a run stopped in the check keeps them."""

    def __init__(self, on_row: Callable[[list[Any]], None]) -> None:
        super().__init__()
        self._on_row = on_row

    def append(self, row: Any) -> None:
        super().append(row)
        self._on_row(self)


# Set by `attempt` while a check runs: where its rows go as they come.
_on_row: Callable[[list[Any]], None] | None = None


def section_rows() -> list[Any]:
    """The list a check builds its rows in: live (each row written to the run's files at once) inside `attempt`."""
    return [] if _on_row is None else _LiveRows(_on_row)


def _build_or_skip(
    entry: Family, variant: str, device: str, params: Mapping[str, Any], rows: list[dict[str, Any]]
) -> Case | None:
    """Build a case, or record in ``rows`` why it cannot run here (e.g. it needs more devices) and return None."""
    try:
        return entry.build(variant, device=device, **params)
    except SkipCase as skip:
        rows.append({"family": entry.name, "variant": variant, "sizes": dict(params), "skipped": skip.reason})
        return None


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
    rows = section_rows()
    for entry in all_families().values():
        if HAZARDS not in entry.figures:
            continue
        for variant in entry.cases:
            case = _build_or_skip(entry, variant, device, entry.smoke, rows)
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
                 "by_op": hazards.as_dict(), "expected_syncs": expected_syncs(hazards), "cuda_syncs": _value(real),
                 "count_for_count": syncs_agree(hazards, real)}
            )
    return rows


def _corpus_line(construct: scan_corpus.Construct) -> tuple[str, int]:
    # The helper's syncs are at its callee's line, where the scan reports them.
    run = scan_corpus._nonzero_rows if construct is scan_corpus.HELPER else construct.run
    return scan_corpus.line_of(run)


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
        line = _corpus_line(construct)
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
             "cuda_syncs": _value(counted if isinstance(counted, Unavailable) else counted.per_call)}
        )
    cpu_labels = scan_corpus.expected_per_line("cpu")
    summary = {
        "cpu scan against labels": _agreement(cpu_scan, cpu_labels),
        f"{device} scan against cpu scan": _agreement(
            {line: n for line, n in device_scan.items() if line in cpu_labels}, cpu_scan),
    }
    if missing is not None:
        summary["against real CUDA syncs"] = _value(missing)
    else:
        summary["cpu scan against real CUDA syncs"] = _agreement(
            cpu_scan, {line: n for line, n in real.items() if line in cpu_labels})
        summary["labels against real CUDA syncs"] = _agreement(labels, real)
    return {"rows": rows, "agreement": summary}


def gate(device: str, _sizes: Sizes) -> list[dict[str, Any]]:
    """``pitfalls check`` on the device: every variant against naive; a row whose own path did not run is n/a."""
    rows = section_rows()
    for row in check_all((device,)):
        verdict = "n/a" if row.skipped else ("yes" if row.matches else "NO")
        rows.append({"family": row.family, "variant": row.variant, "matches_naive": verdict,
                     "max_abs_diff": None if row.skipped else row.max_abs_diff,
                     "ran": f"stand-in: {row.stand_in}" if row.stand_in else ("-" if row.skipped else "its own"),
                     "detail": f"not run here: {row.skipped}" if row.skipped else row.detail})
    return rows


def nvml_while_looping(device: str, sizes: Sizes) -> list[dict[str, Any]]:
    """NVML's utilization, memory, power and clock while each case loops for a few seconds, at the first of
    each family's sizes."""
    rows = section_rows()
    for entry in all_families().values():
        if NVML not in entry.figures:
            continue
        params = sizes.of(entry)[0]
        for variant in entry.cases:
            case = _build_or_skip(entry, variant, device, params, rows)
            if case is None:
                continue
            calls = 0

            def counted(case: Case = case) -> None:
                nonlocal calls
                case()
                calls += 1

            with case:
                case()  # warm-up, outside the sampled window
                synchronize(case.device)
                summary = nvml_window(counted, case.device, sizes.nvml_seconds)
            steps = calls
            row: dict[str, Any] = {"family": entry.name, "variant": variant, "sizes": params, "calls": steps}
            if isinstance(summary, NvmlSummary):
                for name in ("utilization_pct", "nvml_utilization_pct", "memory_used_mib", "power_w",
                             "sm_clock_mhz"):
                    metric = getattr(summary, name)
                    row[name] = _value(metric) if isinstance(metric, Unavailable) else round(metric.mean, 1)
                row["samples"] = getattr(summary.utilization_pct, "samples", 0)
            else:
                row["nvml"] = _value(summary)
            rows.append(row)
    return rows


def event_against_host_time(device: str, sizes: Sizes) -> list[dict[str, Any]]:
    """CUDA-event time and host wall time of the same calls, for each family's naive variant and its floor:
    they agree when the host timer synchronizes."""
    rows = section_rows()
    for entry in all_families().values():
        for variant in (entry.baseline, entry.cases[-1]):
            case = _build_or_skip(entry, variant, device, entry.smoke, rows)
            if case is None:
                continue

            def call(case: Case = case) -> None:
                case()
                synchronize(case.device)

            with case:
                host = wall_time(call, warmup=2, min_run_time=sizes.host_seconds).median_s * 1e3
                events = cuda_event_time(case, calls=20, warmup=2)
            event_ms: float | Unavailable = events if isinstance(events, Unavailable) else events.median_ms
            ratio: float | Unavailable = (event_ms if isinstance(event_ms, Unavailable) else host / event_ms
                                          if event_ms > 0 else Unavailable("the events timed no device work"))
            rows.append({"family": entry.name, "variant": variant, "host_ms": round(host, 3),
                         "cuda_event_ms": _value(event_ms), "host_over_events": _value(ratio)})
    return rows


def speedups(device: str, sizes: Sizes) -> list[dict[str, Any]]:
    """Interleaved speedups over naive of every variant and floor, at each of the family's article sizes (the
    loss at batch 256, 256x256 is the article's headline)."""
    rows = section_rows()
    for entry in all_families().values():
        if SPEEDUP not in entry.figures:
            continue
        for params in sizes.of(entry):
            naive = _build_or_skip(entry, entry.baseline, device, params, rows)
            if naive is None:
                continue
            with naive:
                for variant in entry.cases[1:]:
                    candidate = _build_or_skip(entry, variant, device, params, rows)
                    if candidate is None:
                        continue
                    with candidate:
                        result = measure.speedup(naive, candidate, rounds=sizes.rounds, blocks=sizes.rounds, calls=5,
                                                 seconds=sizes.speedup_seconds)
                    rows.append({"family": entry.name, "variant": variant, "sizes": params,
                                 "speedup": round(result.ratio, 2),
                                 "naive_ms": round(result.baseline_median_s * 1e3, 3),
                                 "variant_ms": round(result.candidate_median_s * 1e3, 3)})
    return rows


def loader_step_cost(device: str, _sizes: Sizes) -> list[dict[str, Any]]:
    """The loader's model_ms step (a matmul loop sized by timing its products on a GPU, a clock spin on a CPU):
    planted against measured milliseconds per call, synchronized; then the verdict of two rungs with it."""
    from pitfalls.families.loader import stepcost, verdict

    rows = section_rows()
    for model_ms in (2, 10, 50):
        planted, measured = stepcost.planted_against_measured(model_ms, torch.device(device))
        rows.append({"model_ms": planted, "measured_ms": round(measured, 3), "ratio": round(measured / planted, 3)})
    entry = all_families()["loader"]
    for variant in ("naive", "uint8"):
        try:
            found = verdict.verdict(variant, device, **{**entry.smoke, "model_ms": 10})
        except SkipCase as skip:
            rows.append({"model_ms": 10, "variant": variant, "verdict": f"n/a: {skip.reason}"})
            continue
        rows.append({"model_ms": 10, "variant": variant, "verdict": found.describe()})
    return rows


def calibration(device: str, _sizes: Sizes) -> list[dict[str, Any]]:
    """The calibration table (`pitfalls calibrate`) on this device: on a GPU its CUDA rows run too, first (the
    CPU rows are CI's every run; these are what only a GPU machine can show)."""
    from pitfalls.calibration.run import all_checks, run_checks
    from pitfalls.known.table import CUDA

    columns = ("check", "unit", "planted", "measured", "error", "tolerance", "verdict", "reason")
    rows = section_rows()
    for check in sorted(all_checks(), key=lambda check: check.device != CUDA):
        [row] = run_checks([check], device)
        rows.append({c: getattr(row, c) for c in columns})
    return rows


def parallel_memory(device: str, sizes: Sizes) -> list[dict[str, Any]]:
    """The parallel family per variant: device 0's estimated and measured peak memory, and (GPU) the largest global
    batch that fits, the article's "the gathered outputs force a smaller batch" in numbers."""
    entry = all_families()["parallel"]
    rows = section_rows()
    for params in sizes.of(entry):
        if device == "cuda":
            params = {**params, "world_size": max(1, min(int(params["world_size"]), torch.cuda.device_count()))}
        for variant in entry.variants:
            estimates = parallel.device_estimates(variant, params)
            row: dict[str, Any] = {"family": entry.name, "variant": variant, "sizes": dict(params),
                                   "device0_estimated_bytes": estimates[0]}
            case = _build_or_skip(entry, variant, device, params, rows)
            if case is None:
                continue
            with case:
                figures = parallel.measure_figures(case, steps=3, nvml_seconds=0.1)
            row["device0_measured_bytes"] = _value(figures.rank0_memory())
            row["memory_imbalance"] = _value(figures.memory_imbalance())
            row["largest_global_batch"] = (largest_global_batch(variant, params) if device == "cuda"
                                           else _value(Unavailable("no CUDA device")))
            rows.append(row)
    return rows


def largest_global_batch(variant: str, params: Mapping[str, Any], deadline: float | None = None) -> Any:
    """The largest global batch of a variant that ran on the GPUs (a bounded search, measured: out of memory is
    "does not fit"); ">= N" when the search's bound still fit or its time limit (a ``time.monotonic()``
    ``deadline``) came first, n/a with the reason when it could not search."""
    world = int(params["world_size"])
    try:
        per_rank = memory.largest_fitting(memory.fits_on_gpu(variant, world, int(params["image_size"])),
                                          deadline=deadline)
    except SkipCase as skip:
        return _value(Unavailable(skip.reason))
    if isinstance(per_rank, Unavailable):
        return _value(per_rank)
    if isinstance(per_rank, memory.Stopped):
        below = f", < {per_rank.high * world}" if per_rank.high is not None else ""
        return f">= {per_rank.low * world}{below} (the search's time limit stopped it)"
    if per_rank == memory.BATCH_LIMIT:
        return f">= {per_rank * world} (the search stops at {memory.BATCH_LIMIT} images per rank)"
    return per_rank * world


def asv_quick_grid(device: str, out: Path, machine: str) -> dict[str, Any]:
    """Run the asv quick grid's cases for ``device`` into ``out/results``; skipped with the reason if it can't."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        return {"skipped": "not a git checkout: asv needs the commit it measures"}
    if importlib.util.find_spec("asv") is None:
        return {"skipped": "asv is not installed (pip install asv asv-runner)"}
    # The main job's configuration, machine record and environment, with the results kept in ``out``.
    conf = runner.write_staged_conf(ROOT / "asv.conf.json", out, results_dir=out / "results")
    runner.record_machine(machine, out / "results", runner.hardware(sys.executable, device))
    # On the CPU (a dry run) one cheap class stands for the grid; on CUDA every CUDA case runs, and the calibration
    # table's CUDA rows as the site publishes them.
    selection = ([f"'{device}'", r"\.(Cuda|Nvml)\.", cuda_calibration_selection()] if device == "cuda"
                 else [r"bench_sampler\.SyncHazards"])
    command = [*asv_command(sys.executable), "run", "--config", str(conf), "--machine", machine,
               "-E", INSTALLED_ENV, "--set-commit-hash", head_commit(ROOT), "--show-stderr"]
    for regex in selection:
        command += ["-b", regex]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    (out / "asv-run.log").write_text(done.stdout + done.stderr)
    return {"exit_code": done.returncode, "seconds": round(time.perf_counter() - started, 1),
            "results": str(out / "results" / machine), "log": str(out / "asv-run.log")}


def cuda_calibration_selection() -> str:
    """An asv ``-b`` pattern for the published errors of the calibration table's CUDA checks (and no other)."""
    from pitfalls.calibration.published import ERROR_METHOD
    from pitfalls.calibration.run import all_checks
    from pitfalls.known.table import CUDA

    names = "|".join(re.escape(repr(check.name)) for check in all_checks() if check.device == CUDA)
    return rf"^bench_calibration\.Error\w*\.{ERROR_METHOD}\(({names})\)$"


def machine_name(device: str) -> str:
    """A results folder name that says what the figures were measured on (``$PITFALLS_MACHINE`` overrides)."""
    return os.environ.get("PITFALLS_MACHINE") or runner.machine_name(runner.hardware(sys.executable, device))


def render_rows(rows: list[dict[str, Any]]) -> str:
    """Rows as a markdown table, its columns the keys in the order they first appear."""
    if not rows:
        return "(nothing measured)\n"
    columns = list(dict.fromkeys(key for row in rows for key in row))
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(row.get(c, "")) for c in columns) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def render_corpus(found: dict[str, Any]) -> str:
    """The scan corpus check: its agreement summary, then its rows."""
    agreement = [{"check": k, "agreement": v} for k, v in found["agreement"].items()]
    return render_rows(agreement) + "\n" + render_rows(found["rows"])


@dataclass(frozen=True)
class Section:
    """One check of a proof run: the key it has in ``figures.json`` (and ``--only``), and its part of the report.

    Attributes:
        key: the check's name.
        title: its heading in ``report.md``.
        intro: what a reader needs to read its table.
        measure: ``measure(device, sizes)``, the check itself.
        render: its figures as markdown.
    """

    key: str
    title: str
    intro: str
    measure: Callable[[str, Sizes], Any]
    render: Callable[[Any], str] = render_rows


SECTIONS: tuple[Section, ...] = (
    Section("syncs", "Real CUDA syncs against sync hazards (per call)",
            "Hazards are counted on the eager program on any device; syncs by PyTorch's CUDA sync debug mode. Each "
            "variant's real syncs per call must equal its hazards count for count (`expected_syncs`: one sync per "
            f"hazard, except {SYNCS_PER_HAZARD or 'no op'}).", syncs_against_hazards),
    Section("corpus", "The scan corpus: labels, the scan, and real CUDA syncs per line",
            "Each construct is one line (`pitfalls.scan_corpus`); real syncs are counted under "
            "`torch.cuda.set_sync_debug_mode(\"warn\")`, the scan on the eager program.",
            scan_corpus_on_device, render_corpus),
    Section("gate", "Every variant against naive (pitfalls check)",
            "A variant whose own code path did not run here (a stand-in ran instead) is n/a, never a pass.", gate),
    Section("nvml", "NVML while each case loops",
            "Utilization is the share of time any kernel ran (not SM occupancy): a sync-bound loop can still read "
            "high.", nvml_while_looping),
    Section("timing", "CUDA-event time against host time (ms per call, smoke sizes)", "", event_against_host_time),
    Section("speedups", "Speedup over naive, interleaved in one process",
            "At each family's article sizes; the floor is each family's job done as fast as the hardware allows. The "
            "loss / ignore_index row at batch 256, 256x256 is article 000's headline (240x on an A10G).", speedups),
    Section("parallel memory", "parallel: device 0's memory and the largest global batch that fits",
            "Per variant at the article's size: device 0's estimated and measured peak (CUDA max allocated) and the "
            "largest global batch a bounded search ran (GPU only).", parallel_memory),
    Section("scan_loader", "scan-loader: pin_memory off and on (the loader family's naive variant, smoke size)", "",
            pinned_against_unpinned),
    Section("loader step cost", "loader: the model_ms step, planted against measured (ms per call), and the verdict "
            "with it", "", loader_step_cost),
    Section("calibration", "Calibration: known answers through the suite's instruments (`pitfalls calibrate`)", "",
            calibration),
)
# The asv quick grid runs last, after every section above: it is the longest part, and its results are files.
ASV = "asv"
ASV_TITLE = "asv quick grid on this device"
NOT_REACHED = {"skipped": "not reached: the run stopped before this check"}
UNFINISHED = {"skipped": "started, not finished: the run stopped (or hung) in this check"}
# The rows a check had finished when it stopped or raised, kept beside what happened to it.
ROWS_DONE = "rows done"


def _failed(outcome: dict[str, Any]) -> str:
    return f"**failed**: `{outcome['error']}`\n\n```\n{outcome['traceback'].rstrip()}\n```\n"


def is_failure(outcome: Any) -> bool:
    """Whether a check's outcome is an error it raised (with its traceback) rather than figures."""
    return isinstance(outcome, dict) and "error" in outcome and "traceback" in outcome


def section_text(outcome: Any, render: Callable[[Any], str]) -> str:
    """A check's outcome as markdown: its figures, or why it has none (skipped, failed, stopped part-way)."""
    # The rows a check had finished when it raised or the run stopped come first, then what happened.
    finished = render(outcome[ROWS_DONE]) + "\n" if isinstance(outcome, dict) and outcome.get(ROWS_DONE) else ""
    if is_failure(outcome):
        return finished + _failed(outcome)
    if isinstance(outcome, dict) and set(outcome) - {ROWS_DONE} == {"skipped"}:
        after = f" (after the {len(outcome[ROWS_DONE])} rows above)" if finished else ""
        return f"{finished}skipped: {outcome['skipped']}{after}\n"
    return render(outcome)


def render_report(figures: dict[str, Any]) -> str:
    """The markdown report of one proof run, also of one that stopped part-way (its missing checks say so)."""
    env = figures["environment"]
    seconds = figures.get("seconds", "(still running, or stopped)")
    parts = [
        "# GPU proof\n",
        f"Device `{figures['device']}`, GPU: {env.get('gpus')}, torch {env.get('torch')}, CUDA {env.get('cuda')}, "
        f"driver {env.get('driver')}, suite commit {env.get('commit')}. Wall time {seconds} s.\n",
    ]
    failures = failed_checks(figures)
    if failures:
        parts.append(f"Checks that raised (each one's traceback is in its section): {', '.join(failures)}.\n")
    for section in SECTIONS:
        parts.append(f"## {section.title}\n")
        if section.intro:
            parts.append(section.intro + "\n")
        parts.append(section_text(figures.get(section.key, NOT_REACHED), section.render))
    parts += [f"## {ASV_TITLE}\n", section_text(figures.get(ASV, NOT_REACHED), lambda outcome: render_rows([outcome]))]
    return "\n".join(parts)


def failed_checks(figures: Mapping[str, Any]) -> list[str]:
    """The names of the checks of a proof run that raised instead of measuring."""
    return [key for key in check_names() if is_failure(figures.get(key))]


def attempt(figures: dict[str, Any], key: str, measure: Callable[[], Any],
            write: Callable[[dict[str, Any]], None]) -> None:
    """Run one check into ``figures[key]``, ``write`` saving the figures when it starts, after each row of it
    (`section_rows`) and when it ends: a run stopped in the check keeps the rows it finished.

    If it raises, its outcome is the error and its traceback, so that the checks after it run. The error is not
    hidden: it is printed, written into its section of the report, and makes the run exit 1.

    Args:
        figures: every check's outcome so far, by key; ``figures[key]`` is set.
        key: the check's name.
        measure: the check itself.
        write: saves ``figures`` (whole files, renamed into place: a time limit can stop the run while it writes).
    """
    global _on_row
    print(f"{key} ...", file=sys.stderr, flush=True)
    figures[key] = dict(UNFINISHED)
    write(figures)

    def on_row(rows: list[Any]) -> None:
        figures[key] = {**UNFINISHED, ROWS_DONE: list(rows)}
        write(figures)

    _on_row = on_row
    try:
        figures[key] = measure()
    except Exception as error:  # any error of one check: recorded, and the run goes on to the next
        trace = traceback.format_exc()
        print(trace, file=sys.stderr, flush=True)
        done = figures[key].get(ROWS_DONE)  # the rows on_row last wrote, if any
        figures[key] = {"error": f"{type(error).__name__}: {error}", "traceback": trace}
        if done:
            figures[key][ROWS_DONE] = done
    finally:
        _on_row = None
    write(figures)


def _write(out: Path, figures: dict[str, Any]) -> None:
    # Whole or not at all: a time limit can stop the run while it writes.
    text = json.dumps(figures, indent=2, default=str)
    atomic_write(out / "figures.json", lambda path: path.write_text(text))
    report = render_report(figures)
    atomic_write(out / "report.md", lambda path: path.write_text(report))


def check_names() -> tuple[str, ...]:
    """Every check a proof run can do, in the order it does them (the choices of ``--only``)."""
    return (*(s.key for s in SECTIONS), ASV)


def unknown_checks(only: Sequence[str]) -> list[str]:
    """The names in ``only`` that are no check of a proof run."""
    return [name for name in only if name not in check_names()]


def run(out: Path, device: str, *, with_asv: bool = True, only: Sequence[str] = ()) -> dict[str, Any]:
    """Run every check and write ``report.md`` and ``figures.json`` into ``out``, after each check.

    A check that raises is recorded with its traceback and the next one runs; a run stopped part-way (a time
    limit, a hang) leaves the checks it finished, the one it was in marked unfinished, the others not reached.

    Args:
        out: the folder for the report and asv's results (created; files of an earlier run are replaced).
        device: "cuda" for the proof; "cpu" for a dry run with small sizes.
        with_asv: also run the asv quick grid's cases for the device.
        only: run these checks alone (names of `check_names`); every check when empty.

    Returns:
        The figures, as written to ``figures.json``.
    """
    unknown = unknown_checks(only)
    if unknown:
        raise ValueError(f"no such check: {', '.join(unknown)} (choose from {', '.join(check_names())})")
    out.mkdir(parents=True, exist_ok=True)
    sizes = GPU_SIZES if device == "cuda" else DRY_RUN_SIZES
    started = time.perf_counter()
    figures: dict[str, Any] = {"device": device, "sizes": asdict(sizes), "environment": environment_facts()}
    chosen = set(only or check_names())
    # Every check is "not reached" until it runs, so that a run stopped part-way says so in figures.json too.
    figures.update({key: dict(NOT_REACHED) for key in check_names()})
    write = functools.partial(_write, out)
    for section in SECTIONS:
        if section.key not in chosen:
            figures[section.key] = {"skipped": f"not selected (--only {','.join(only)})"}
            continue
        attempt(figures, section.key, functools.partial(section.measure, device, sizes), write)
    if not with_asv:
        figures[ASV] = {"skipped": "--no-asv"}
    elif ASV not in chosen:
        figures[ASV] = {"skipped": f"not selected (--only {','.join(only)})"}
    else:
        attempt(figures, ASV, functools.partial(asv_quick_grid, device, out, machine_name(device)), write)
    figures["seconds"] = round(time.perf_counter() - started, 1)
    _write(out, figures)
    return figures


def _rows(figures: Mapping[str, Any], key: str) -> list[dict[str, Any]]:
    outcome = figures.get(key)
    return outcome if isinstance(outcome, list) else []


def main(argv: Sequence[str] | None = None) -> int:
    """Command line of ``scripts/gpu-proof``; returns the exit status."""
    parser = argparse.ArgumentParser(prog="gpu-proof", description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder for report.md, figures.json and asv results")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                        help="cuda (the proof) or cpu (a dry run with small sizes)")
    parser.add_argument("--no-asv", action="store_true", help="skip the asv quick grid")
    parser.add_argument("--only", default="", metavar="CHECK[,CHECK]",
                        help=f"run these checks alone, e.g. to repeat one that failed ({', '.join(check_names())})")
    args = parser.parse_args(argv)
    only = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = unknown_checks(only)
    if unknown:
        parser.error(f"--only: no such check {', '.join(map(repr, unknown))} (choose from "
                     f"{', '.join(check_names())})")
    if args.device == "cuda" and not cuda_available():
        parser.error("no CUDA device here; run on a GPU machine, or use --device cpu for a dry run")
    figures = run(args.out, args.device, with_asv=not args.no_asv, only=only)
    print((args.out / "report.md").read_text())
    disagreements = [row for row in _rows(figures, "syncs") if row["count_for_count"] == "NO"]
    failed = [row for row in _rows(figures, "gate") if row["matches_naive"] == "NO"]
    return 1 if disagreements or failed or failed_checks(figures) else 0


if __name__ == "__main__":
    sys.exit(main())

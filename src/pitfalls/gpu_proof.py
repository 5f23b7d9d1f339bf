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
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from pitfalls.devices import cuda_available, synchronize
from pitfalls.family import HAZARDS, NVML, SPEEDUP, Case, Family, SkipCase
from pitfalls.probes import (
    NvmlSampler,
    NvmlSummary,
    Unavailable,
    count_cuda_syncs,
    count_hazards,
    cuda_event_time,
    environment,
    interleaved_speedup,
    is_available,
    wall_time,
)
from pitfalls.registry import all_families

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Sizes:
    """How a proof run sizes its cases: the article's sizes on a GPU, every family's smoke size for a dry run.

    Attributes:
        article: use each family's ``article_sizes`` for NVML and speedups (else its smoke size).
        nvml_seconds: seconds each case loops while NVML samples.
        rounds: interleaved rounds of each speedup.
    """

    article: bool
    nvml_seconds: float
    rounds: int

    def of(self, entry: Family) -> tuple[dict[str, Any], ...]:
        """The sizes to measure a family at."""
        sizes = entry.article_sizes if self.article and entry.article_sizes else (entry.smoke,)
        return tuple(dict(s) for s in sizes)


GPU_SIZES = Sizes(article=True, nvml_seconds=3.0, rounds=10)
DRY_RUN_SIZES = Sizes(article=False, nvml_seconds=0.2, rounds=3)


def _value(figure: Any) -> Any:
    """A JSON-able figure: the number, or ``"unavailable: <reason>"``."""
    return str(figure) if isinstance(figure, Unavailable) else figure


def _closing(case: Case) -> None:
    if case.close is not None:
        case.close()


def syncs_against_hazards(device: str, _sizes: Sizes) -> list[dict[str, Any]]:
    """For every variant and floor: sync hazards of the eager program and real CUDA syncs, per call.

    The counts do not depend on size, only on the code path, so every family is counted at its smoke size.
    """
    rows = []
    for entry in all_families().values():
        if HAZARDS not in entry.figures:
            continue
        for variant in entry.cases:
            case = entry.build(variant, device=device, **entry.smoke)
            case()
            synchronize(case.device)
            hazards = count_hazards(case).total
            syncs = count_cuda_syncs(case, calls=5, warmup=1)
            _closing(case)
            real = syncs.per_call if is_available(syncs) else syncs
            agrees = "n/a" if not is_available(syncs) else ("yes" if (hazards == 0) == (real == 0) else "NO")
            rows.append(
                {"family": entry.name, "variant": variant, "sizes": dict(entry.smoke), "sync_hazards": hazards,
                 "cuda_syncs": _value(real), "zero_together": agrees}
            )
    return rows


def nvml_while_looping(device: str, sizes: Sizes) -> list[dict[str, Any]]:
    """NVML's utilization, memory, power and clock while each case loops for a few seconds, at the first of
    each family's sizes."""
    rows = []
    for entry in all_families().values():
        if NVML not in entry.figures:
            continue
        params = sizes.of(entry)[0]
        for variant in entry.cases:
            try:
                case = entry.build(variant, device=device, **params)
            except SkipCase as skip:
                rows.append({"family": entry.name, "variant": variant, "sizes": params, "skipped": skip.reason})
                continue
            case()
            synchronize(case.device)
            steps = 0
            with NvmlSampler(case.device if case.device.type == "cuda" else 0) as sampler:
                deadline = time.perf_counter() + sizes.nvml_seconds
                while time.perf_counter() < deadline:
                    case()
                    steps += 1
                synchronize(case.device)
            _closing(case)
            summary = sampler.summary
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


def event_against_host_time(device: str, _sizes: Sizes) -> list[dict[str, Any]]:
    """CUDA-event time and host wall time of the same calls, for each family's naive variant and its floor:
    they agree when the host timer synchronizes."""
    rows = []
    for entry in all_families().values():
        for variant in (entry.baseline, entry.cases[-1]):
            case = entry.build(variant, device=device, **entry.smoke)

            def call(case: Case = case) -> None:
                case()
                synchronize(case.device)

            host = wall_time(call, warmup=2, min_run_time=0.5).median_s * 1e3
            events = cuda_event_time(case, calls=20, warmup=2)
            _closing(case)
            event_ms = events.median_ms if is_available(events) else events
            ratio = host / event_ms if is_available(event_ms) else Unavailable(str(event_ms.reason))
            rows.append({"family": entry.name, "variant": variant, "host_ms": round(host, 3),
                         "cuda_event_ms": _value(event_ms), "host_over_events": _value(ratio)})
    return rows


def speedups(device: str, sizes: Sizes) -> list[dict[str, Any]]:
    """Interleaved speedups over naive of every variant and floor, at each of the family's article sizes (the
    loss at batch 256, 256x256 is the article's headline)."""
    rows = []
    for entry in all_families().values():
        if SPEEDUP not in entry.figures:
            continue
        for params in sizes.of(entry):
            try:
                naive = entry.build(entry.baseline, device=device, **params)
            except SkipCase as skip:
                rows.append({"family": entry.name, "sizes": params, "skipped": skip.reason})
                continue
            for variant in entry.cases[1:]:
                try:
                    candidate = entry.build(variant, device=device, **params)
                except SkipCase as skip:  # a variant that needs what this machine lacks
                    rows.append({"family": entry.name, "variant": variant, "sizes": params, "skipped": skip.reason})
                    continue
                result = interleaved_speedup(
                    naive, candidate, rounds=sizes.rounds, warmup=1, sync=functools.partial(synchronize, naive.device)
                )
                _closing(candidate)
                rows.append({"family": entry.name, "variant": variant, "sizes": params,
                             "speedup": round(result.ratio, 2),
                             "naive_ms": round(result.baseline_median_s * 1e3, 3),
                             "variant_ms": round(result.candidate_median_s * 1e3, 3)})
            _closing(naive)
    return rows


def asv_quick_grid(device: str, out: Path, machine: str) -> dict[str, Any]:
    """Run the asv quick grid's cases for ``device`` into ``out/results``; skipped with the reason if it can't."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        return {"skipped": "not a git checkout: asv needs the commit it measures"}
    try:
        from asv import util
    except ImportError:
        return {"skipped": "asv is not installed (pip install asv asv-runner)"}
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
    # asv's own reader, as scripts/run-suite uses: the config carries // comments.
    conf = util.load_json(str(ROOT / "asv.conf.json"), js_comments=True)
    for key in ("repo", "benchmark_dir", "env_dir", "html_dir"):
        conf[key] = str(ROOT / conf[key])
    conf["results_dir"] = str(out / "results")
    (out / "asv.conf.json").write_text(json.dumps(conf, indent=2))
    # On the CPU (a dry run) one cheap class stands for the grid; on CUDA every CUDA case runs.
    selection = [f"'{device}'", r"\.(Cuda|Nvml)\."] if device == "cuda" else [r"bench_sampler\.SyncHazards"]
    command = [sys.executable, "-m", "asv", "run", "--config", str(out / "asv.conf.json"), "--machine", machine,
               "-E", "existing:same", "--set-commit-hash", commit.stdout.strip(), "--show-stderr"]
    for regex in selection:
        command += ["-b", regex]
    subprocess.run([sys.executable, "-m", "asv", "machine", "--yes", "--machine", machine], cwd=ROOT,
                   capture_output=True, check=True)
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    (out / "asv-run.log").write_text(done.stdout + done.stderr)
    return {"exit_code": done.returncode, "seconds": round(time.perf_counter() - started, 1),
            "results": str(out / "results" / machine), "log": str(out / "asv-run.log")}


def machine_name(device: str) -> str:
    """A results folder name that says what the figures were measured on."""
    label = f"gpu {torch.cuda.get_device_name(0)}" if device == "cuda" else f"cpu {os.cpu_count()}cpu"
    return re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")


def _table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "(nothing measured)\n"
    columns = list(dict.fromkeys(key for row in rows for key in row))
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(row.get(c, "")) for c in columns) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def render_report(figures: dict[str, Any]) -> str:
    """The markdown report of one proof run."""
    env = figures["environment"]
    parts = [
        "# GPU proof\n",
        f"Device `{figures['device']}`, GPU: {env.get('gpus')}, torch {env.get('torch')}, CUDA {env.get('cuda')}, "
        f"driver {env.get('driver')}, suite commit {env.get('commit')}. Wall time {figures['seconds']} s.\n",
        "## Real CUDA syncs against sync hazards (per call)\n",
        "Hazards are counted on the eager program on any device; syncs by PyTorch's CUDA sync debug mode. A variant "
        "with no hazard must show no sync, and one with hazards must show syncs.\n",
        _table(figures["syncs"]),
        "## NVML while each case loops\n",
        "Utilization is the share of time any kernel ran (not SM occupancy): a sync-bound loop can still read high.\n",
        _table(figures["nvml"]),
        "## CUDA-event time against host time (ms per call, smoke sizes)\n",
        _table(figures["timing"]),
        "## Speedup over naive, interleaved in one process\n",
        "At each family's article sizes; the floor is each family's job done as fast as the hardware allows. The "
        "loss / ignore_index row at batch 256, 256x256 is article 000's headline (240x on an A10G).\n",
        _table(figures["speedups"]),
        "## asv quick grid on this device\n",
        _table([figures["asv"]]),
    ]
    return "\n".join(parts)


def run(out: Path, device: str, *, with_asv: bool = True) -> dict[str, Any]:
    """Run every check and write ``report.md`` and ``figures.json`` into ``out``.

    Args:
        out: the folder for the report and asv's results (created; files of an earlier run are replaced).
        device: "cuda" for the proof; "cpu" for a dry run with small sizes.
        with_asv: also run the asv quick grid's cases for the device.

    Returns:
        The figures, as written to ``figures.json``.
    """
    out.mkdir(parents=True, exist_ok=True)
    sizes = GPU_SIZES if device == "cuda" else DRY_RUN_SIZES
    started = time.perf_counter()
    figures: dict[str, Any] = {"device": device, "sizes": asdict(sizes), "environment": environment()}
    for name, check in (("syncs", syncs_against_hazards), ("nvml", nvml_while_looping),
                        ("timing", event_against_host_time), ("speedups", speedups)):
        print(f"gpu-proof: {name} ...", file=sys.stderr, flush=True)
        figures[name] = check(device, sizes)
    if with_asv:
        print("gpu-proof: asv quick grid ...", file=sys.stderr, flush=True)
        figures["asv"] = asv_quick_grid(device, out, machine_name(device))
    else:
        figures["asv"] = {"skipped": "--no-asv"}
    figures["seconds"] = round(time.perf_counter() - started, 1)
    (out / "figures.json").write_text(json.dumps(figures, indent=2, default=str))
    (out / "report.md").write_text(render_report(figures))
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    """Command line of ``scripts/gpu-proof``; returns the exit status."""
    parser = argparse.ArgumentParser(prog="gpu-proof", description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder for report.md, figures.json and asv results")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                        help="cuda (the proof) or cpu (a dry run with small sizes)")
    parser.add_argument("--no-asv", action="store_true", help="skip the asv quick grid")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not cuda_available():
        parser.error("no CUDA device here; run on a GPU machine, or use --device cpu for a dry run")
    figures = run(args.out, args.device, with_asv=not args.no_asv)
    print((args.out / "report.md").read_text())
    disagreements = [row for row in figures["syncs"] if row["zero_together"] == "NO"]
    return 1 if disagreements else 0


if __name__ == "__main__":
    sys.exit(main())

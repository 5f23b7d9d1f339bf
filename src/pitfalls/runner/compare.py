"""``scripts/compare``: the regression gate, two commits measured in one managed environment.

``asv continuous`` builds both commits into one virtualenv and runs each benchmark for both, rounds interleaved
so that a busy machine's drift does not read as a change; ``asv compare`` always exits 0, so it cannot gate.
Which figures gate where, and why times gate only with a GPU by default: docs/asv.md ("Regression gate"). The
results go to ``.asv/compare/results``, not results/: a gate's two quick runs are not the published history.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from pitfalls.asv_files import file_name, load
from pitfalls.grids import DEFAULT_GRID, GRID_ENV, ROUNDS_ENV
from pitfalls.runner import store
from pitfalls.runner.conf import CONF_NAME, RunnerError, project_paths, write_staged_conf
from pitfalls.runner.history import select
from pitfalls.runner.job import checked_grid, in_stage, log, prepare_machine, report_errors, run_marked, split_at_dashes
from pitfalls.runner.staging import Stage
from pitfalls.runner.worktree import commit_of
from pitfalls_asv_main import command as asv_command

__all__ = ["COUNTS", "TIMES", "counts_verdict", "gate_times_by_default", "main"]

COUNTS = r"\.track_sync_hazards|\.track_cuda_syncs|\.track_graph_breaks|\.track_recompiles|\.track_bytes"
TIMES = r"\.time_|\.peakmem_"
WORK = Path(".asv") / "compare"


def gate_times_by_default(machine_facts: dict[str, str], environ: dict[str, str] | None = None) -> bool:
    """Whether times gate: ``PITFALLS_COMPARE_TIMES`` if set, else whether the machine has a GPU."""
    env = os.environ if environ is None else environ
    choice = env.get("PITFALLS_COMPARE_TIMES", "").strip()
    if choice not in ("", "0", "1"):
        raise RunnerError(f"PITFALLS_COMPARE_TIMES={choice!r} is not allowed; use 1 (gate times) or 0 (counts only)")
    return choice == "1" if choice else "gpu" in machine_facts


def _results_of(results_dir: str, machine: str, env_name: str, commit: str, pattern: str) -> Iterator[tuple]:
    """asv compare's result rows of one commit, for the benchmarks whose name matches ``pattern``."""
    path = Path(results_dir) / file_name(machine, commit, env_name)
    if not path.is_file():
        return
    with store.readable():
        result = load(path)
    for key in result.get_all_result_keys():
        if not re.search(pattern, key):
            continue
        params = result.get_result_params(key)
        yield (key, params, result.get_result_value(key, params), result.get_result_stats(key, params),
               result.get_result_samples(key, params), result.benchmark_version.get(key), machine, env_name)


def counts_verdict(conf_path: str | Path, machine: str, env_name: str, base: str, head: str, factor: float,
                   pattern: str = COUNTS) -> bool:
    """Print asv's comparison of the gated figures only and return whether one got worse by more than ``factor``.

    Args:
        conf_path: the asv configuration the results were written with.
        machine, env_name: whose results to compare.
        base, head: the two commits (full hashes).
        factor: how much worse a figure must be to count.
        pattern: the gated benchmarks (a regex on asv's benchmark names).
    """
    from asv.commands.compare import Compare
    from asv.config import Config

    conf: Any = Config.load(str(conf_path))
    rows = [list(_results_of(conf.results_dir, machine, env_name, commit, pattern)) for commit in (base, head)]
    if not all(rows):
        log("none of the measured figures is a gated count: nothing gates")
        return False
    worsened, _ = Compare.print_table(
        conf, base, head, factor=factor, split=False, only_changed=True, sort="ratio",
        resultset_1=iter(rows[0]), resultset_2=iter(rows[1]), commit_names={base: base[:8], head: head[:8]},
    )
    return bool(worsened)


def _gate(root: Path, stage: Stage, base: str, candidate: str, extra: Sequence[str], factor: float) -> int:
    commits = [commit_of(root, name) for name in (base, candidate)]
    torch = os.environ.get("PITFALLS_COMPARE_TORCH", "")
    env_name = select(root / CONF_NAME, [torch] if torch else [])[0]
    work = root / WORK
    # The machine's facts come from the project's record of it, as for the main job; the results stay apart.
    record = prepare_machine(project_paths(root / CONF_NAME)["results_dir"])
    gate_times = gate_times_by_default(record.facts)
    measured = os.environ.get("PITFALLS_COMPARE_BENCH") or f"{COUNTS}|{TIMES}"
    conf = write_staged_conf(root / CONF_NAME, work, results_dir=work / "results")
    log(f"== asv continuous {base} {candidate} in {env_name} on {record.name}, factor {factor}, grid "
        f"{os.environ['PITFALLS_GRID']}, {os.environ['PITFALLS_ROUNDS']} rounds; gating "
        + ("every measured figure" if gate_times else "the exact counts (times reported, not gated: no GPU)"))
    command = [*asv_command(sys.executable), "continuous", "--config", str(conf), "--machine", record.name,
               "-E", env_name, "--factor", str(factor), "--split", "-b", measured, *extra, base, candidate]
    status = run_marked(command, stage, dict(os.environ, TMPDIR=str(stage.tmp)))
    if status == 1 and not gate_times:
        log("== the gated figures: exact counts")
        status = 1 if counts_verdict(conf, record.name, env_name, commits[0], commits[1], factor) else 0
    verdicts = {0: f"compare: no regression beyond a factor of {factor}",
                1: f"compare: REGRESSION: a gated figure got worse by more than a factor of {factor} (see above)",
                2: "compare: a benchmark failed (see above)"}
    log(verdicts.get(status, f"compare: asv continuous could not run (exit {status})"))
    return status


def _compare(root: Path, base: str, candidate: str, extra: Sequence[str]) -> int:
    try:
        factor = float(os.environ.get("PITFALLS_COMPARE_FACTOR", "1.2"))
    except ValueError as error:
        raise RunnerError(f"PITFALLS_COMPARE_FACTOR={os.environ['PITFALLS_COMPARE_FACTOR']!r} is not a number, "
                          "e.g. 1.2 for 20 %") from error
    os.environ.setdefault(GRID_ENV, DEFAULT_GRID)
    os.environ.setdefault(ROUNDS_ENV, "2")
    checked_grid()
    return in_stage(root, lambda stage: _gate(root, stage, base, candidate, extra, factor))


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``BASE [CANDIDATE] [-- asv continuous options]`` and run the gate."""
    args, extra = split_at_dashes(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="compare", description="Measure two commits in one managed environment and "
                                     "fail on a real regression. Exit 0: none; 1: a gated figure got worse; 2: a "
                                     "benchmark failed or bad input.")
    parser.add_argument("base", help="the commit to compare against, e.g. origin/main")
    parser.add_argument("candidate", nargs="?", default="HEAD", help="the commit to test (default HEAD)")
    parsed = parser.parse_args(args)
    return report_errors(lambda: _compare(Path.cwd(), parsed.base, parsed.candidate, extra))

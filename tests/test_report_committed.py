"""`pitfalls report` on the results committed in results/ (HEAD's, tests/committed.py: a user's own run in the
working tree adds nothing to them): every benchmark they hold is in the report."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from asv import results as asv_results
from packaging.version import Version
from suite import import_suite_module

from pitfalls import registry, report


@pytest.fixture(scope="module")
def results(committed_inputs: Path) -> Path:
    return committed_inputs / "results"


@pytest.fixture(scope="module")
def committed_files(results: Path) -> list[asv_results.Results]:
    return [
        asv_results.Results.load(str(path))
        for path in sorted(results.glob("*/*.json"))
        if path.name not in ("machine.json", "benchmarks.json")
    ]


def torch_of(result: asv_results.Results) -> str | None:
    return report.torch_version(result.params, result._requirements, result.env_name)[0]


@pytest.fixture(scope="module")
def readme(tmp_path_factory, results: Path) -> str:
    out = tmp_path_factory.mktemp("report")
    return report.write_report(results, out).read_text(encoding="utf-8")


@pytest.mark.slow
def test_every_benchmark_of_the_committed_results_is_in_the_report(readme, committed_files):
    names = {name for result in committed_files for name in result.get_all_result_keys()}
    assert len(names) >= 23
    # Series that ended (a suite module's RETIRED) stay in the results they made; where such a result is still the
    # newest of its machine, the report shows the row under "other benchmarks" (since removed), and only there.
    retired = {name for entry in registry.BUILTIN
               for name in getattr(import_suite_module(f"bench_{entry.name}"), "RETIRED", ())}
    assert {"bench_parallel.Step.time_step", "bench_calibration.ErrorInMs.track_error"} <= retired
    missing = sorted(name for name in names - retired if f"`{name}`" not in readme)
    assert missing == []
    assert "Left out of this report" not in readme  # every committed file reads
    # benchmarks.json describes every benchmark of the committed results but the retired ones.
    others = re.findall(r"^#### other: .*?\n\nBenchmarks: (.*)$", readme, flags=re.MULTILINE)
    undescribed = {name for line in others for name in re.findall(r"`([^`]+)`", line)}
    assert undescribed <= retired, sorted(undescribed - retired)


@pytest.mark.slow
def test_every_run_whose_results_name_a_torch_version_is_headed_by_it(readme, committed_files):
    runs = re.findall(r"^### (torch \S+|env \S+), commit ([0-9a-f]{8})$", readme, flags=re.MULTILINE)
    assert runs, "no run headings"
    for label, commit in runs:
        files = [r for r in committed_files if r.commit_hash.startswith(commit)]
        (shown,) = [r for r in files if label in (f"torch {torch_of(r)}", f"env {r.env_name}")]
        assert label == (f"torch {torch_of(shown)}" if torch_of(shown) else f"env {shown.env_name}")
    assert readme.count("- torch: unknown") == sum(1 for label, _ in runs if label.startswith("env "))


@pytest.mark.slow
def test_the_newest_commit_measured_under_two_torch_versions_is_compared(readme, committed_files):
    versions: dict[str, set[str]] = {}
    dates: dict[str, int] = {}
    for result in committed_files:
        torch = torch_of(result)
        if torch:
            versions.setdefault(result.commit_hash, set()).add(torch)
            dates[result.commit_hash] = result.date
    several = sorted((c for c, v in versions.items() if len(v) >= 2), key=dates.__getitem__)
    assert several, "the committed results hold no commit measured under two torch versions"
    comparison = readme.split("## Across torch versions", 1)[1]
    headings = [line for line in comparison.splitlines() if line.startswith("### ")]
    newest = several[-1]
    labels = " vs ".join(f"torch {v}" for v in sorted(versions[newest], key=Version))
    assert f"### cpu-amd-epyc-2cpu: {labels} at commit {newest[:8]}" in headings
    for older in several[:-1]:
        assert f"{older[:8]} (`cpu-amd-epyc-2cpu`)" in comparison


@pytest.mark.slow
def test_time_tables_without_a_floor_case_say_so_and_those_with_one_show_the_ratio(readme, results, committed_files):
    shown = {(r.env, r.commit) for r in report.read_results(results).rows}
    with_floor = without = 0
    for result in committed_files:
        if (result.env_name, result.commit_hash) not in shown:
            continue
        for name in result.get_all_result_keys():
            if name.rsplit(".", 1)[-1].startswith("time_"):
                variants = result.get_result_params(name)[0]
                with_floor += "'floor'" in variants
                without += "'floor'" not in variants
    assert with_floor + without >= 2 * len(shown)  # loss and sampler each have a time_ benchmark
    assert readme.count("x floor: n/a for every case: these results have no `floor` case") == without
    assert readme.count(" | x floor |") == with_floor

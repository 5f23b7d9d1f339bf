"""pitfalls merge for real: two machines' results from two real main-job runs, one published site showing both,
and the main job's result in the same series as the committed virtualenv runs of its torch version."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import site_browser as browser
from asv import util
from sandbox import (
    bootstrapped,  # noqa: F401 (an autouse fixture)
    git,
    make_sandbox,
    run_script,
    tree_digest,
)
from site_browser import serving

from pitfalls import asv_files

pytestmark = pytest.mark.slow


ONE = r"bench_sampler\.SyncHazards\.track_sync_hazards\('static', 1000, 1, 'cpu'\)"
BENCH = "bench_sampler.SyncHazards.track_sync_hazards"
# The committed results' machine: a run recorded under its name takes its recorded facts (see
# pitfalls.runner.machine), which is what lets the new result join the committed series.
COMMITTED = "cpu-amd-epyc-2cpu"
# Every machine the repository's committed results hold (the fleet's first node brings them all).
COMMITTED_MACHINES = frozenset(
    p.name for p in (Path(__file__).resolve().parents[1] / "results").iterdir() if p.is_dir())
SECOND = "cpu-fleet-b"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory) -> dict[str, Path]:
    """Two checkouts of one commit, each with one real main-job run recorded under its own machine."""
    root = tmp_path_factory.mktemp("fleet")
    first = make_sandbox(root / "first")
    subprocess.run(["git", "clone", "-q", str(first), str(root / "second")], check=True)
    second = root / "second"
    for repo, machine in ((first, COMMITTED), (second, SECOND)):
        home = root / f"home-{machine}"
        home.mkdir()
        done = run_script(repo, "run-suite", "-b", ONE, "--no-publish", home=home, PITFALLS_MACHINE=machine)
        assert done.returncode == 0, done.stderr[-5000:]
    return {"first": first, "second": second, "root": root}


@pytest.fixture(scope="module")
def merged(fleet) -> dict[str, Any]:
    """Both machines merged into one folder and one site, once for the module: no test relies on another's run."""
    out, site = fleet["root"] / "merged", fleet["root"] / "site"
    done = merge(str(fleet["first"] / "results"), str(fleet["second"] / "results"), "--out", str(out), "--html",
                 str(site), "--config", str(fleet["first"] / "asv.conf.json"))
    return {**fleet, "done": done, "out": out, "site": site}


def merge(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pitfalls.cli", "merge", *args], capture_output=True, text=True,
                          timeout=600, check=False)


def test_merge_brings_both_machines_together_and_publishes_one_site(merged):
    first, second, out, site, done = (merged[k] for k in ("first", "second", "out", "site", "done"))
    assert done.returncode == 0, done.stderr[-5000:]
    assert {p.name for p in out.iterdir() if p.is_dir()} == COMMITTED_MACHINES | {SECOND}
    for machine in (COMMITTED, SECOND):
        facts = util.load_json(str(out / machine / "machine.json"), api_version=1)
        assert facts["machine"] == machine and all(facts[k] for k in ("arch", "cpu", "num_cpu", "os", "ram"))
    head = git(first, "rev-parse", "HEAD").strip()
    for machine in (COMMITTED, SECOND):
        assert (out / machine / f"{head[:8]}-installed-py3.11-torch2.13.0.json").is_file()
    # The committed results came along unchanged, with the new run beside them.
    committed = tree_digest(first / "results" / COMMITTED)
    merged = tree_digest(out / COMMITTED)
    assert {k: v for k, v in merged.items() if k in committed and "installed" not in k} == {
        k: v for k, v in committed.items() if "installed" not in k}
    # Merging the same folders again changes nothing.
    before = tree_digest(out)
    again = merge(str(first / "results"), str(second / "results"), "--out", str(out), "--no-publish",
                  "--config", str(first / "asv.conf.json"))
    assert again.returncode == 0 and tree_digest(out) == before
    index = json.loads((site / "index.json").read_text())
    assert set(index["params"]["machine"]) == COMMITTED_MACHINES | {SECOND}
    # No absolute path in a facet: one Python value, torch by version.
    assert index["params"]["python"] == ["3.11"]
    assert set(index["params"]["torch"]) <= {"2.13.0", "2.14.1"}


def graph_points(site: Path, machine: str, torch: str) -> list:
    """The points of BENCH's graph for one machine and torch version (asv writes one file per series)."""
    found = [path for path in (site / "graphs").rglob(f"{BENCH}.json")
             if f"machine-{machine}" in path.parts and f"torch-{torch}" in path.parts]
    assert len(found) == 1, found
    return json.loads(found[0].read_text())


def test_the_main_jobs_result_joins_the_torch_series_of_the_virtualenv_runs(merged):
    first, site = merged["first"], merged["site"]
    assert merged["done"].returncode == 0, merged["done"].stderr[-5000:]
    revisions = json.loads((site / "index.json").read_text())["revision_to_hash"]
    by_hash = {commit[:8]: int(revision) for revision, commit in revisions.items()}
    points = graph_points(site, COMMITTED, "2.13.0")
    plotted = {revision for revision, *_ in points}
    head = git(first, "rev-parse", "HEAD").strip()[:8]
    # One series: the committed virtualenv runs (bbd3ab19), the relabelled main job (aa3a6c21) and this run.
    for commit in ("bbd3ab19", "aa3a6c21", head):
        assert by_hash[commit] in plotted, commit


@pytest.mark.skipif(browser.find_chromium() is None, reason="no chromium on PATH (scripts/test installs it as root)")
def test_the_merged_site_shows_both_machines_in_the_browser(merged):
    site = merged["site"]
    assert merged["done"].returncode == 0, merged["done"].stderr[-5000:]
    with serving(site) as url:
        dom = browser.render_page(url + f"index.html#{BENCH}")
    assert "failed to load" not in dom
    assert '<canvas class="flot-base"' in dom[dom.index('id="main-graph"'):]
    facets = dom[dom.index('id="graphdisplay-state-params"'):dom.index('id="graphdisplay-navigation-params"')]
    assert '<div class="panel-heading">machine</div>' in facets
    for machine in (COMMITTED, SECOND):
        assert f">{machine}</a>" in facets, machine
    # asv shows a facet only where values differ: one Python (3.11, no interpreter path), torch by version.
    assert '<div class="panel-heading">python</div>' not in facets and "_bin_python" not in dom
    assert 'role="button">2.13.0</a>' in facets and 'role="button">2.14.1</a>' in facets


def test_merge_refuses_a_folder_of_another_suite_and_changes_nothing(fleet, tmp_path):
    first, second = fleet["first"], fleet["second"]
    other = tmp_path / "other"
    subprocess.run(["cp", "-a", str(second / "results"), str(other)], check=True)
    suite = asv_files.read_json(other / "benchmarks.json", 2)
    suite[BENCH]["version"] = "0" * 64
    util.write_json(str(other / "benchmarks.json"), suite, api_version=2)
    out = fleet["root"] / "merged"
    before = tree_digest(out)
    done = merge(str(first / "results"), str(other), "--out", str(out), "--no-publish",
                 "--config", str(first / "asv.conf.json"))
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert "describe different suites" in done.stderr and BENCH in done.stderr
    assert tree_digest(out) == before

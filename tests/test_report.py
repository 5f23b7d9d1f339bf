"""`pitfalls.report`: real asv results (from a small asv project run here) to markdown tables and PNG charts."""

from __future__ import annotations

import itertools
import json
import logging
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import matplotlib.image
import pytest
from asv import results as asv_results
from asv import util as asv_util

from pitfalls import report
from pitfalls.report import Row, chart_data, drawing

ASV = Path(sys.executable).with_name("asv")
PITFALLS = Path(sys.executable).with_name("pitfalls")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
DPI = 110
# The tests that read the toy project share one module-scoped asv run of several seconds.
uses_asv_run = pytest.mark.slow

# A toy suite shaped like the real one: a variant x size x device x mode class with time_, peakmem_ and a speedup
# track_, whose variant axis ends with the family's floor, where every cuda case and two cpu cases skip in setup
# (one of them the floor's); a class without a floor and without a size axis; a class skipped everywhere; and a
# class with other params whose track_ fails for one case.
TOY_SUITE = """
class Sum:
    param_names = ["variant", "n", "device", "mode"]
    params = [["naive", "fast", "floor"], [10, 100, 1000], ["cpu", "cuda"], ["eager", "compiled"]]

    def setup(self, variant, n, device, mode):
        if device == "cuda":
            raise NotImplementedError("no CUDA device")
        if (variant, n, mode) in (("fast", 100, "compiled"), ("floor", 10, "compiled")):
            raise NotImplementedError("not on this machine")
        self.data = list(range(n))

    def time_sum(self, variant, n, device, mode):
        sum(self.data)

    def peakmem_sum(self, variant, n, device, mode):
        sum(self.data)

    def track_speedup(self, variant, n, device, mode):
        return {"naive": 1.0, "fast": 2.5, "floor": 4.0}[variant]

    track_speedup.unit = "x"


class Single:
    param_names = ["variant", "batch", "mode"]
    params = [["naive", "fast"], [4], ["eager", "compiled"]]

    def time_single(self, variant, batch, mode):
        sum(range(100))


class Gpu:
    param_names = ["variant", "mode"]
    params = [["naive", "fast"], ["eager", "compiled"]]

    def setup(self, variant, mode):
        raise NotImplementedError("no CUDA device")

    def track_gpu_busy(self, variant, mode):
        return 50.0

    track_gpu_busy.unit = "%"


class Count:
    param_names = ["variant", "n"]
    params = [["naive", "fast"], [10, 100]]

    def track_hazards(self, variant, n):
        if (variant, n) == ("naive", 10):
            raise RuntimeError("broken case")
        return 3 if variant == "naive" else 0

    track_hazards.unit = "hazards/call"
"""

# A family the report has never heard of, shaped like a data loader: bool and str parameters, a throughput, bytes
# and a memory figure in MiB, none of them named in the report's code.
FEED_SUITE = """
class Feed:
    param_names = ["variant", "workers", "pin_memory", "storage"]
    params = [["naive", "packed", "floor"], [0, 2, 4], [False, True], ["disk", "ram"]]

    def setup(self, variant, workers, pin_memory, storage):
        if pin_memory and storage == "disk":
            raise NotImplementedError("pinned reads from disk are not measured")
        self.items = list(range(100 * (workers + 1)))

    def time_batch(self, variant, workers, pin_memory, storage):
        sorted(self.items)

    def track_samples_per_second(self, variant, workers, pin_memory, storage):
        return {"naive": 100.0, "packed": 400.0, "floor": 800.0}[variant] * (workers + 1)

    track_samples_per_second.unit = "samples/s"

    def track_bytes_per_batch(self, variant, workers, pin_memory, storage):
        return 167772160 if variant == "naive" else 33554432

    track_bytes_per_batch.unit = "bytes"

    def track_pss(self, variant, workers, pin_memory, storage):
        return 12.5 * (workers + 1)

    track_pss.unit = "MiB"
"""

# The second environment's interpreter lives in a folder named like a torch version, so that asv's environment
# name carries one ("existing-py_..._torch9.8.7_python"), as a matrix environment's name does; the version is a
# label only (the toy suite does not import torch).
SECOND_TORCH = "9.8.7"


@dataclass(frozen=True)
class Project:
    root: Path
    results: Path
    first_commit: str
    second_commit: str
    env: dict[str, str]


def _git(root: Path, *args: str, env: dict[str, str]) -> str:
    done = subprocess.run(["git", "-C", str(root), *args], env=env, check=True, capture_output=True, text=True)
    return done.stdout.strip()


def _asv(root: Path, *args: str, env: dict[str, str]) -> None:
    done = subprocess.run(
        [str(ASV), *args], cwd=root, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    # asv exits 2 when a benchmark failed, which the toy suite does on purpose.
    assert done.returncode in (0, 2), done.stdout + done.stderr


def _commit(root: Path, message: str, day: int, env: dict[str, str]) -> str:
    # Distinct commit dates: asv orders commits by them, and two commits made in one second would tie.
    dated = {**env, "GIT_AUTHOR_DATE": f"2026-01-0{day}T12:00:00Z", "GIT_COMMITTER_DATE": f"2026-01-0{day}T12:00:00Z"}
    _git(root, "add", "-A", env=dated)
    _git(root, "commit", "-qm", message, env=dated)
    return _git(root, "rev-parse", "HEAD", env=env)


def _run(root: Path, commit: str, *args: str, env: dict[str, str]) -> None:
    _asv(root, "run", "--quick", "--set-commit-hash", commit, "--machine", "toybox", *args, env=env)


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Project:
    """Run the toy suite with asv: commit 1 in one environment, commit 2 in two environments (one machine)."""
    root = tmp_path_factory.mktemp("asv-project")
    home = tmp_path_factory.mktemp("home")  # asv writes ~/.asv-machine.json: keep it out of the real home
    env = {
        **os.environ,
        "HOME": str(home),
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.org",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.org",
    }
    (root / "benchmarks").mkdir()
    (root / "benchmarks" / "__init__.py").write_text("")
    (root / "benchmarks" / "bench_toy.py").write_text(TOY_SUITE)
    (root / "benchmarks" / "bench_feed.py").write_text(FEED_SUITE)
    (root / "asv.conf.json").write_text(
        '{"version": 1, "project": "toy", "repo": ".", "dvcs": "git", "branches": ["HEAD"], '
        '"environment_type": "existing", "benchmark_dir": "benchmarks", "results_dir": "results", '
        '"html_dir": "html", "env_dir": "env", "launch_method": "forkserver"}'
    )
    (root / ".gitignore").write_text("results/\nhtml/\nenv/\n.asv/\n")
    # A second interpreter path makes a second asv environment without installing anything.
    second = root / f"torch{SECOND_TORCH}" / "python"
    second.parent.mkdir()
    second.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    second.chmod(0o755)
    _git(root, "init", "-q", ".", env=env)
    first = _commit(root, "one", 1, env)
    _asv(
        root, "machine", "--yes", "--machine", "toybox", "--cpu", "Toy CPU", "--num_cpu", "2", "--os", "Linux", env=env
    )
    # The older commit runs one class only: enough to tell commits apart, and quicker.
    _run(root, first, "-E", "existing:same", "-b", "Count", env=env)
    (root / "NOTES").write_text("a later commit\n")
    second_commit = _commit(root, "two", 2, env)
    _run(root, second_commit, "-E", "existing:same", "-E", f"existing:{second}", env=env)
    return Project(root, root / "results", first, second_commit, env)


@pytest.fixture(scope="module")
def rows(project) -> list[Row]:
    return list(report.read_results(project.results).rows)


def result_file(results: Path, commit: str, second: bool = False) -> Path:
    """The results file of a commit in the first (or the second) environment."""
    files = sorted((results / "toybox").glob(f"{commit[:8]}-*.json"))
    (path,) = [p for p in files if (f"torch{SECOND_TORCH}" in p.name) == second]
    return path


def one_env(rows: list[Row], *, second: bool = False) -> list[Row]:
    return [r for r in rows if (r.torch == SECOND_TORCH) == second]


def find(rows: list[Row], figure: str, **params) -> Row:
    (match,) = [r for r in rows if r.figure == figure and all(r.params[k] == v for k, v in params.items())]
    return match


def asv_value(path: Path, benchmark: str, *params: str) -> float:
    """The value asv's own loader gives for one case (params in asv's repr form)."""
    result = asv_results.Results.load(str(path))
    names = result.get_result_params(benchmark)
    values = result.get_result_value(benchmark, names)
    combos = list(itertools.product(*names))
    return values[combos.index(params)]


# ------------------------------------------------------------------------------------------------ loading


@uses_asv_run
def test_rows_carry_values_units_and_typed_params(project, rows):
    mine = one_env(rows)
    assert {r.commit for r in rows} == {project.second_commit}
    assert len({r.env for r in rows}) == 2
    # One row per benchmark and parameter combination: 3 figures x 36 cases of Sum, 4 of Single, Gpu, Count,
    # 4 figures x 36 cases of Feed.
    assert len(mine) == 3 * 36 + 4 + 4 + 4 + 4 * 36
    speedup = find(mine, "track_speedup", variant="fast", n=1000, device="cpu", mode="eager")
    assert (speedup.value, speedup.unit, speedup.status, speedup.kind) == (2.5, "x", "ok", "track")
    assert speedup.params == {"variant": "fast", "n": 1000, "device": "cpu", "mode": "eager"}
    assert find(mine, "track_speedup", variant="naive", n=10, device="cpu", mode="compiled").value == 1.0
    assert find(mine, "track_speedup", variant="floor", n=10, device="cpu", mode="eager").value == 4.0
    assert find(mine, "track_hazards", variant="naive", n=100).value == 3.0
    assert find(mine, "track_hazards", variant="fast", n=10).value == 0.0
    assert find(mine, "track_hazards", variant="fast", n=10).unit == "hazards/call"
    path = result_file(project.results, project.second_commit)
    timed = find(mine, "time_sum", variant="naive", n=10, device="cpu", mode="eager")
    assert (timed.unit, timed.kind) == ("seconds", "time")
    assert timed.value == asv_value(path, "bench_toy.Sum.time_sum", "'naive'", "10", "'cpu'", "'eager'")
    memory = find(mine, "peakmem_sum", variant="naive", n=10, device="cpu", mode="eager")
    assert (memory.unit, memory.kind) == ("bytes", "peakmem")
    assert memory.value == asv_value(path, "bench_toy.Sum.peakmem_sum", "'naive'", "10", "'cpu'", "'eager'")
    feed = find(mine, "track_samples_per_second", variant="packed", workers=2, pin_memory=False, storage="ram")
    assert (feed.family, feed.value, feed.unit) == ("feed", 1200.0, "samples/s")
    assert feed.params == {"variant": "packed", "workers": 2, "pin_memory": False, "storage": "ram"}
    assert {r.family for r in rows} == {"toy", "feed"}
    assert mine[0].machine == "toybox" and mine[0].machine_facts["cpu"] == "Toy CPU"
    assert all(r.in_suite for r in rows)


@uses_asv_run
def test_the_torch_version_of_every_run_is_read_from_what_asv_recorded(rows):
    # The first environment's name is the interpreter's path, with no torch version in it: unknown, not invented.
    assert {(r.torch, r.torch_from) for r in one_env(rows)} == {(None, None)}
    assert {(r.torch, r.torch_from) for r in one_env(rows, second=True)} == {(SECOND_TORCH, "environment name")}


@pytest.mark.parametrize(
    ("params", "requirements", "env_name", "found"),
    [
        ({"torch": "2.14.1"}, {"torch": "2.14.1"}, "virtualenv-py3.11-torch2.14.1", ("2.14.1", "asv params")),
        ({"python": "3.11"}, {"torch": "2.13.0"}, "virtualenv-py3.11-torch2.13.0", ("2.13.0", "asv requirements")),
        ({"python": "3.11"}, {}, "existing-py3.11-torch2.13.0", ("2.13.0", "environment name")),
        ({}, {}, "virtualenv-py3.11-numpy2.1-torch2.11.0+cu130", ("2.11.0+cu130", "environment name")),
        ({"torch": ""}, {"torch": ""}, "virtualenv-py3.11-torch", (None, None)),
        ({"python": "/work/main/.venv/bin/python3"}, {}, "existing-py_work_main_.venv_bin_python3", (None, None)),
        ({}, {}, "existing-py_opt_torchserve_bin_python", (None, None)),
    ],
)
def test_torch_version_sources(params, requirements, env_name, found):
    assert report.torch_version(params, requirements, env_name) == found


@uses_asv_run
def test_skipped_and_failed_cases_have_no_value_and_say_which(rows):
    mine = one_env(rows)
    for figure in ("time_sum", "peakmem_sum", "track_speedup"):
        skipped = find(mine, figure, variant="fast", n=100, device="cpu", mode="compiled")
        assert (skipped.value, skipped.status) == (None, "skipped")
        cuda = [r for r in mine if r.figure == figure and r.params["device"] == "cuda"]
        assert len(cuda) == 18 and all(r.value is None and r.status == "skipped" for r in cuda)
    failed = find(mine, "track_hazards", variant="naive", n=10)
    assert (failed.value, failed.status) == (None, "failed")
    measured = [r for r in mine if r.status == "ok"]
    # 30 of Sum's 36 cases per figure are skipped or n/a: cuda (18), fast n=100 compiled, floor n=10 compiled.
    assert len([r for r in measured if r.figure == "time_sum"]) == 36 - 18 - 2
    assert all(isinstance(r.value, float) for r in measured)


@uses_asv_run
def test_newest_commit_by_default_and_a_commit_prefix_selects_another(project, rows):
    older = list(report.read_results(project.results, commit=project.first_commit[:7]).rows)
    assert {r.commit for r in older} == {project.first_commit}
    assert len({r.env for r in older}) == 1  # the first commit ran in one environment, one class only
    assert {r.benchmark for r in older} == {"bench_toy.Count.track_hazards"}
    assert {r.commit for r in rows} == {project.second_commit}


@uses_asv_run
def test_without_benchmarks_json_units_come_from_the_names(project, tmp_path):
    copy = tmp_path / "results"
    shutil.copytree(project.results, copy)
    (copy / "benchmarks.json").unlink()
    loaded = report.read_results(copy)
    rows = one_env(list(loaded.rows))
    timed = [r for r in rows if r.figure == "time_sum"]
    assert {r.unit for r in timed} == {"seconds"} and {r.kind for r in timed} == {"time"}
    # asv's own default names for parameters whose names it no longer knows.
    assert list(timed[0].params) == ["param1", "param2", "param3", "param4"]
    assert find(rows, "track_speedup", param1="fast", param2=1000, param3="cpu", param4="eager").value == 2.5
    assert not any(r.in_suite for r in rows)
    assert any("No benchmarks.json" in note for note in loaded.notes)


@uses_asv_run
def test_machine_filter(project, rows):
    assert list(report.read_results(project.results, machine="toybox").rows) == rows


@uses_asv_run
def test_unknown_machine_names_the_folder_and_the_known_ones(project):
    with pytest.raises(ValueError, match="machine='elsewhere'") as error:
        report.read_results(project.results, machine="elsewhere")
    assert "toybox" in str(error.value) and str(project.results) in str(error.value)


@uses_asv_run
def test_unknown_commit_lists_the_commits_with_results(project):
    with pytest.raises(ValueError, match="commit='deadbeef'") as error:
        report.read_results(project.results, commit="deadbeef")
    assert project.first_commit[:8] in str(error.value) and project.second_commit[:8] in str(error.value)


def test_a_folder_without_results_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="holds no asv results") as error:
        report.read_results(tmp_path)
    assert str(tmp_path) in str(error.value)
    with pytest.raises(ValueError, match="is not a folder"):
        report.read_results(tmp_path / "missing")
    with pytest.raises(TypeError, match="results_dir"):
        report.read_results(42)


# ----------------------------------------------------------------------------------------------- markdown


def table_line(markdown: str, *cells: str) -> list[str]:
    """The cells of the one table line that starts with these cells."""
    prefix = "| " + " | ".join(cells) + " |"
    (line,) = [line for line in markdown.splitlines() if line.startswith(prefix)]
    return [cell.strip() for cell in line.strip("|").split("|")]


def section(markdown: str, heading: str) -> str:
    """The text from a heading line to the next heading of the same or a higher level."""
    level = heading.split(" ", 1)[0]
    lines = markdown.splitlines()
    start = lines.index(heading)
    end = next(
        (i for i in range(start + 1, len(lines)) if re.match(rf"#{{1,{len(level)}}} ", lines[i])), len(lines)
    )
    return "\n".join(lines[start:end])


@uses_asv_run
def test_markdown_shows_numbers_for_measured_cases_and_na_for_skipped(project, rows):
    mine = one_env(rows)
    text = report.summary_markdown(mine)
    header = table_line(text, "variant", "n", "device", "mode")
    assert header[4:] == ["time per call", "speedup over naive", "x floor", "peak host memory"]
    cells = table_line(text, "fast", "1000", "cpu", "eager")
    timed = find(mine, "time_sum", variant="fast", n=1000, device="cpu", mode="eager").value
    memory = find(mine, "peakmem_sum", variant="fast", n=1000, device="cpu", mode="eager").value
    floor = find(mine, "time_sum", variant="floor", n=1000, device="cpu", mode="eager").value
    assert cells[4:] == [
        asv_util.human_value(timed, "seconds"),
        "2.5x",
        f"{timed / floor:.3g}x",
        asv_util.human_value(memory, "bytes"),
    ]
    assert table_line(text, "fast", "100", "cpu", "compiled")[4:] == ["n/a", "n/a", "n/a", "n/a"]
    assert table_line(text, "naive", "10", "cpu", "eager")[5] == "1x"
    # Every cuda case is n/a: said once, not as 18 lines of n/a.
    assert "n/a (skipped) for every case with device=cuda (18 cases)" in text
    assert not [line for line in text.splitlines() if line.startswith("| ") and "| cuda |" in line]
    # The other class's table: its own params, the failure shown as such.
    assert "| variant | n | hazards (hazards/call) |" in text.splitlines()
    lines = text.splitlines()
    # A class skipped in every case gets one line, not a table of n/a.
    assert "GPU busy: n/a (skipped) for every case (4 cases)." in lines
    assert "| naive | 10 | failed |" in lines
    assert "| naive | 100 | 3 |" in lines and "| fast | 10 | 0 |" in lines
    # Each table names the benchmarks it shows.
    assert "Benchmarks: `bench_toy.Sum.peakmem_sum`, `bench_toy.Sum.time_sum`, `bench_toy.Sum.track_speedup`." in lines
    for needed in ("toybox", project.second_commit, "Toy CPU", "- torch: unknown: the results file names none"):
        assert needed in text


@uses_asv_run
def test_every_variant_reads_as_a_multiple_of_the_floor(rows):
    mine = one_env(rows)
    text = report.summary_markdown(mine)

    def time(variant, n, mode):
        return find(mine, "time_sum", variant=variant, n=n, device="cpu", mode=mode).value

    for variant in ("naive", "fast", "floor"):
        for n in (100, 1000):
            cells = table_line(text, variant, str(n), "cpu", "eager")
            assert cells[6] == f"{time(variant, n, 'eager') / time('floor', n, 'eager'):.3g}x"
    assert table_line(text, "floor", "1000", "cpu", "eager")[6] == "1x"
    # The floor is shown like a variant, last, with its own speedup over naive.
    assert table_line(text, "floor", "100", "cpu", "eager")[5] == "4x"
    table = section(text, "#### toy: per variant, n, device, mode")
    variants = [line.split("|")[1].strip() for line in table.splitlines() if line.startswith("| ")]
    assert [v for v in dict.fromkeys(variants) if v in ("naive", "fast", "floor")] == ["naive", "fast", "floor"]
    # The floor was skipped at n=10 compiled: the ratio says why it is missing.
    assert table_line(text, "naive", "10", "cpu", "compiled")[6] == "n/a (floor n/a)"
    assert table_line(text, "floor", "10", "cpu", "compiled")[4:7] == ["n/a", "n/a", "n/a"]
    # A class with a time_ benchmark but no floor case (results made before the family had one).
    single = section(text, "#### toy: per variant, batch, mode")
    assert "x floor" not in table_line(single, "variant", "batch", "mode")
    assert "x floor: n/a for every case: these results have no `floor` case" in single


@uses_asv_run
def test_a_family_the_report_does_not_know_is_shown_by_its_own_names_and_units(rows):
    mine = one_env(rows)
    text = report.summary_markdown(mine)
    feed = section(text, "#### feed: per variant, workers, pin memory, storage")
    header = table_line(feed, "variant", "workers", "pin_memory", "storage")
    assert header[4:] == [
        "time per call",
        "x floor",
        "bytes per batch",
        "pss (MiB)",
        "samples per second (samples/s)",
    ]
    timed = find(mine, "time_batch", variant="packed", workers=2, pin_memory=False, storage="ram").value
    floor = find(mine, "time_batch", variant="floor", workers=2, pin_memory=False, storage="ram").value
    assert table_line(feed, "packed", "2", "False", "ram")[4:] == [
        asv_util.human_value(timed, "seconds"),
        f"{timed / floor:.3g}x",
        "33.6M",
        "37.5",
        "1200",
    ]
    assert table_line(feed, "naive", "0", "False", "disk")[6:] == ["168M", "12.5", "100"]
    assert table_line(feed, "floor", "4", "True", "disk")[4:] == ["n/a"] * 5


@uses_asv_run
def test_two_environments_at_one_commit_get_a_comparison_table(rows):
    text = report.summary_markdown(rows)
    assert "## Across torch versions" in text
    comparison = text.split("## Across torch versions", 1)[1]
    header = table_line(comparison, "variant", "n", "device", "mode")
    first, second = one_env(rows, second=True), one_env(rows)
    # Columns: known torch versions in version order, then environments without one.
    assert header[4:] == [f"time, torch {SECOND_TORCH}", f"time, env {second[0].env}", "ratio"]
    a = find(first, "time_sum", variant="naive", n=1000, device="cpu", mode="eager").value
    b = find(second, "time_sum", variant="naive", n=1000, device="cpu", mode="eager").value
    cells = table_line(comparison, "naive", "1000", "cpu", "eager")
    assert cells[4:] == [asv_util.human_value(a, "seconds"), asv_util.human_value(b, "seconds"), f"{b / a:.2f}"]
    assert table_line(comparison, "fast", "100", "cpu", "compiled")[4:] == ["n/a", "n/a", "n/a"]
    assert "n/a (skipped) in every environment for every case with device=cuda (18 cases)." in comparison
    assert "Benchmark: `bench_feed.Feed.time_batch`." in comparison
    # One environment alone has nothing to compare.
    assert report.comparison_markdown(first) == ""


@pytest.mark.parametrize(
    ("value", "unit", "status", "shown"),
    [
        (1.5e-6, "seconds", "ok", "1.50μs"),
        (0.0123, "seconds", "ok", "12.3ms"),
        (35_800_000.0, "bytes", "ok", "35.8M"),
        (2.5, "x", "ok", "2.5x"),
        (87.25, "%", "ok", "87.2 %"),
        (3.0, "hazards/call", "ok", "3"),
        (0.0, "hazards/call", "ok", "0"),
        (1200.0, "samples/s", "ok", "1200"),
        (None, "seconds", "skipped", "n/a"),
        (None, "x", "failed", "failed"),
    ],
)
def test_format_value(value, unit, status, shown):
    assert report.format_value(value, unit, status) == shown


def test_summary_rejects_what_is_not_rows():
    with pytest.raises(ValueError, match="rows is empty"):
        report.summary_markdown([])
    with pytest.raises(TypeError, match="rows must be"):
        report.summary_markdown("results/")
    with pytest.raises(TypeError, match="got int"):
        report.summary_markdown([1, 2])


# ------------------------------------------------------------------------------------------------- charts


def chart_of(charts: list[report.Chart], family: str, figure: str) -> report.Chart:
    (chart,) = [c for c in charts if c.name.startswith(f"{family}-{figure}-")]
    return chart


@uses_asv_run
def test_time_chart_is_log_log_over_n_and_leaves_the_skipped_point_out(rows):
    mine = one_env(rows)
    chart = chart_of(report.build_charts(mine), "toy", "time_sum")
    assert (chart.kind, chart.xlog, chart.ylog) == ("line", True, True)
    assert chart.xlabel.startswith("n") and "time per call (" in chart.ylabel
    assert "toybox" in chart.subtitle
    # The cuda panel had nothing measured: no panel, but said under the chart.
    assert [p.title for p in chart.panels] == ["device=cpu"]
    assert any("device=cuda" in note for note in chart.notes)
    assert any("n=100 [device=cpu]: fast, compiled" in note for note in chart.notes)
    series = {s.label: s for s in chart.panels[0].series}
    assert set(series) == {f"{v}, {m}" for v in ("naive", "fast", "floor") for m in ("eager", "compiled")}
    assert [x for x, _ in series["fast, compiled"].points] == [10.0, 1000.0]
    assert series["fast, compiled"].missing == (100.0,)
    assert series["floor, compiled"].missing == (10.0,) and series["floor, compiled"].variant == "floor"
    assert [x for x, _ in series["naive, eager"].points] == [10.0, 100.0, 1000.0]

    figure = drawing.render(chart)
    (ax,) = [a for a in figure.axes if a.get_visible()]
    drawn = [line for line in ax.get_lines() if line.get_gid() == "fast, compiled"]
    # Two separate pieces, so no line is drawn across the skipped n=100.
    assert sorted(list(line.get_xdata()) for line in drawn) == [[10.0], [1000.0]]
    scale = find(mine, "time_sum", variant="fast", n=10, device="cpu", mode="compiled").value / drawn[0].get_ydata()[0]
    for line in ax.get_lines():
        for x, y in zip(line.get_xdata(), line.get_ydata(), strict=True):
            variant, mode = line.get_gid().split(", ")
            row = find(mine, "time_sum", variant=variant, n=int(x), device="cpu", mode=mode)
            assert y * scale == pytest.approx(row.value)
    # The floor is drawn in its own fixed colour, the same in every chart.
    floors = {line.get_color() for line in ax.get_lines() if line.get_gid().startswith("floor")}
    assert floors == {drawing._FLOOR_COLOUR}


@uses_asv_run
def test_speedup_chart_draws_a_bar_per_measured_case_and_none_for_skipped(rows):
    chart = chart_of(report.build_charts(one_env(rows)), "toy", "track_speedup")
    assert chart.kind == "bar" and chart.reference == 1.0 and "speedup over naive" in chart.ylabel
    assert chart.categories == ("n=10", "n=100", "n=1k")
    # The cuda panels had nothing measured; each mode gets its own panel.
    assert [p.title for p in chart.panels] == ["device=cpu, mode=eager", "device=cpu, mode=compiled"]
    eager, compiled = ({s.label: s for s in p.series} for p in chart.panels)
    assert set(eager) == set(compiled) == {"fast", "floor"}  # the baseline is the reference line, not a bar
    assert eager["fast"].points == ((0.0, 2.5), (1.0, 2.5), (2.0, 2.5)) and eager["fast"].missing == ()
    assert compiled["fast"].points == ((0.0, 2.5), (2.0, 2.5)) and compiled["fast"].missing == (1.0,)
    assert compiled["floor"].points == ((1.0, 4.0), (2.0, 4.0)) and compiled["floor"].missing == (0.0,)

    figure = drawing.render(chart)
    compiled_ax = next(a for a in figure.axes if a.get_title() == "device=cpu, mode=compiled")
    bars = [p for p in compiled_ax.patches if p.get_gid() == "fast"]
    assert [round(bar.get_x() + bar.get_width() / 2, 6) for bar in bars] == [-0.2, 1.8]  # two bars per size
    assert all(bar.get_height() == pytest.approx(2.5) and bar.get_y() == 0 for bar in bars)
    labels = [t.get_text() for t in compiled_ax.texts]
    assert labels == ["2.5x", "2.5x", "n/a", "4x", "4x", "n/a"]  # bar labels, then the gap, per variant
    assert [line.get_ydata()[0] for line in compiled_ax.get_lines()] == [1.0]  # the reference line


@uses_asv_run
def test_charts_only_where_a_figure_has_a_size_axis(rows):
    charts = report.build_charts(one_env(rows))
    # Sum: time and speedup over n. Feed: time and throughput over workers. Single (batch 4 only), Gpu, Count
    # and Feed's bytes and memory: tables only.
    assert sorted(c.name.split("-toybox-")[0] for c in charts) == [
        "feed-time_batch",
        "feed-track_samples_per_second",
        "toy-time_sum",
        "toy-track_speedup",
    ]
    assert chart_data.size_axis([r for r in rows if r.figure == "time_single"]) is None


@uses_asv_run
def test_a_made_up_familys_throughput_is_drawn_over_its_size_axis(rows):
    mine = one_env(rows)
    chart = chart_of(report.build_charts(mine), "feed", "track_samples_per_second")
    assert (chart.kind, chart.xlabel, chart.ylabel) == ("line", "workers", "samples per second (samples/s)")
    assert chart.xticks == (0.0, 2.0, 4.0)
    # Panels per pin_memory x storage; pinned reads from disk were never measured.
    assert [p.title for p in chart.panels] == [
        "pin_memory=False, storage=disk",
        "pin_memory=False, storage=ram",
        "pin_memory=True, storage=ram",
    ]
    assert chart.notes == ("not drawn, nothing measured (n/a or failed) for: pin_memory=True, storage=disk",)
    series = {s.label: s for s in chart.panels[0].series}
    assert series["packed"].points == ((0.0, 400.0), (2.0, 1200.0), (4.0, 2000.0))
    assert series["floor"].points == ((0.0, 800.0), (2.0, 2400.0), (4.0, 4000.0))


@uses_asv_run
def test_charts_are_valid_pngs_of_the_size_they_were_drawn(rows, tmp_path):
    mine = one_env(rows)
    paths = [path for path, _ in drawing.write_charts(mine, tmp_path / "charts")]
    built = {c.name: c for c in report.build_charts(mine)}
    assert len(paths) == len(built) == 4
    for path in paths:
        assert path.parent == tmp_path / "charts" and path.suffix == ".png"
        assert path.read_bytes().startswith(PNG_SIGNATURE)
        image = matplotlib.image.imread(path)
        width, height = drawing.render(built[path.stem]).get_size_inches() * DPI
        assert image.shape == (int(height), int(width), 4)  # Agg truncates the figure size in pixels


# ------------------------------------------------------------------------------------------------- writing


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@uses_asv_run
def test_write_report_writes_readme_and_charts_only_into_out_dir(project, tmp_path):
    before = snapshot(project.results)
    out = tmp_path / "report"
    readme = report.write_report(project.results, out, machine="toybox")
    assert readme == out / "README.md"
    assert snapshot(project.results) == before
    names = sorted(p.name for p in out.iterdir())
    assert "README.md" in names and not [n for n in names if n.startswith(".") or n.endswith(".partial")]
    text = readme.read_text(encoding="utf-8")
    pngs = [n for n in names if n.endswith(".png")]
    assert len(pngs) == 8 and all(f"]({name})" in text for name in pngs)
    assert "| fast | 100 | cpu | compiled | n/a | n/a | n/a | n/a |" in text
    assert "Left out" not in text


@uses_asv_run
def test_write_report_refuses_an_out_dir_inside_the_results(project):
    with pytest.raises(ValueError, match="inside results_dir"):
        report.write_report(project.results, project.results / "report")


def test_an_interrupted_write_leaves_the_previous_file_and_no_partial(tmp_path):
    target = tmp_path / "README.md"
    target.write_text("previous report")

    def crash(path: Path) -> None:
        path.write_text("half a rep")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        report.atomic_write(target, crash)
    assert target.read_text() == "previous report"
    assert [p.name for p in tmp_path.iterdir()] == ["README.md"]
    report.atomic_write(target, lambda p: p.write_text("new report"))
    assert target.read_text() == "new report" and oct(target.stat().st_mode & 0o777) == "0o644"


# ---------------------------------------------------------------------------------- history and torch versions


@pytest.fixture(scope="module")
def history(project, tmp_path_factory) -> tuple[Path, str]:
    """The project one commit later, measured in the first environment only (one class): the second environment's
    newest commit is now older, and the commit measured in both environments is not the newest of either."""
    root = tmp_path_factory.mktemp("asv-history") / "project"
    shutil.copytree(project.root, root)
    (root / "NOTES").write_text("a third commit\n")
    third = _commit(root, "three", 3, project.env)
    _run(root, third, "-E", "existing:same", "-b", "Count", env=project.env)
    return root / "results", third


@uses_asv_run
def test_the_default_report_compares_the_newest_commit_measured_under_two_torch_versions(project, history, tmp_path):
    results, third = history
    text = report.write_report(results, tmp_path / "report").read_text(encoding="utf-8")
    assert "## Across torch versions" in text
    comparison = text.split("## Across torch versions", 1)[1]
    (heading,) = [line for line in comparison.splitlines() if line.startswith("### ")]
    assert heading.startswith(f"### toybox: torch {SECOND_TORCH} vs env ")
    assert heading.endswith(f" at commit {project.second_commit[:8]}")
    assert table_line(comparison, "variant", "n", "device", "mode")[4] == f"time, torch {SECOND_TORCH}"
    assert third[:8] not in comparison


@uses_asv_run
def test_runs_are_listed_newest_first(project, history, tmp_path):
    results, third = history
    text = report.write_report(results, tmp_path / "report").read_text(encoding="utf-8")
    runs = [line for line in text.split("## Across", 1)[0].splitlines() if line.startswith("### ")]
    assert [line.rsplit(" ", 1)[-1] for line in runs] == [third[:8], project.second_commit[:8]]
    assert runs[1] == f"### torch {SECOND_TORCH}, commit {project.second_commit[:8]}"


# --------------------------------------------------------------------------------------- results it cannot read


def damaged_copy(project: Project, tmp_path: Path) -> Path:
    copy = tmp_path / "results"
    shutil.copytree(project.results, copy)
    return copy


def pitfalls_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("pitfalls")]


def rename_single_to_ghost(path: Path) -> None:
    """Rename a benchmark in a results file to one that benchmarks.json does not know."""
    data = json.loads(path.read_text())
    data["results"]["bench_toy.Ghost.time_ghost"] = data["results"].pop("bench_toy.Single.time_single")
    path.write_text(json.dumps(data))


def edit_results(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data["results"])
    path.write_text(json.dumps(data))


@uses_asv_run
def test_a_benchmark_missing_from_benchmarks_json_is_listed_under_other_benchmarks(project, tmp_path, caplog):
    copy = damaged_copy(project, tmp_path)
    rename_single_to_ghost(result_file(copy, project.second_commit))
    with caplog.at_level(logging.WARNING):
        text = report.write_report(copy, tmp_path / "report").read_text(encoding="utf-8")
    ghosts = [r for r in report.read_results(copy).rows if r.benchmark == "bench_toy.Ghost.time_ghost"]
    assert len(ghosts) == 4 and not any(r.in_suite for r in ghosts)
    assert "benchmarks.json does not describe" in section(text, "#### other benchmarks")
    ghost = section(text, "#### other: bench_toy.Ghost: per param1, param2, param3")
    assert "Benchmarks: `bench_toy.Ghost.time_ghost`." in ghost
    assert table_line(ghost, "param1", "param2", "param3")[3:] == ["time per call"]
    for row in ghosts:
        cells = table_line(ghost, row.params["param1"], "4", row.params["param3"])
        assert cells[3:] == [report.format_value(row.value, row.unit, row.status)]
    # The renamed benchmark still stands under its own name in the other environment.
    assert text.count("Benchmarks: `bench_toy.Single.time_single`.") == 1
    assert pitfalls_warnings(caplog) == []  # a benchmark the suite no longer has is not an error


@uses_asv_run
def test_a_result_whose_axes_are_not_benchmarks_json_s_is_listed_under_other_benchmarks(project, tmp_path, caplog):
    # A benchmark that gained an axis since the run: its older results cannot be named by the new axes.
    copy = damaged_copy(project, tmp_path)

    def drop_last_axis(results):
        row = results["bench_toy.Single.time_single"]
        kept = len(row[1][-1])
        row[0], row[1] = row[0][::kept], row[1][:-1]
        for column in range(2, len(row)):
            if isinstance(row[column], list) and len(row[column]) == kept * len(row[0]):
                row[column] = row[column][::kept]

    edit_results(result_file(copy, project.second_commit), drop_last_axis)
    with caplog.at_level(logging.WARNING):
        text = report.write_report(copy, tmp_path / "report").read_text(encoding="utf-8")
    rows = [r for r in list(report.read_results(copy).rows)
            if r.benchmark == "bench_toy.Single.time_single" and r.commit.startswith(project.second_commit[:8])]
    odd = [r for r in rows if not r.in_suite]  # the edited file's; the other environment's stay in the suite
    assert odd and len(odd) < len(rows)
    assert all(list(r.params) == [f"param{i + 1}" for i in range(len(r.params))] for r in odd)
    assert "#### other: bench_toy.Single" in text
    assert pitfalls_warnings(caplog) == []


@uses_asv_run
def test_a_malformed_value_names_the_file_and_the_benchmark_and_the_rest_is_reported(project, tmp_path, caplog):
    copy = damaged_copy(project, tmp_path)
    path = result_file(copy, project.second_commit)

    def damage(results):
        results["bench_toy.Count.track_hazards"][0][1] = "g"

    edit_results(path, damage)
    with caplog.at_level(logging.WARNING):
        text = report.write_report(copy, tmp_path / "report").read_text(encoding="utf-8")
    relative = path.relative_to(copy).as_posix()
    expected = (
        f"{relative}: benchmark bench_toy.Count.track_hazards left out: value 'g' for parameters ('naive', 100) "
        "is not a number (nor null for a failure, NaN for a skip)"
    )
    assert f"- {expected}" in section(text, "## Left out of this report").splitlines()
    assert pitfalls_warnings(caplog) == [f"pitfalls report: {expected}"]
    # The same benchmark in the other environment, and every other benchmark of this file, are still reported.
    assert "| naive | 100 | 3 |" in text.splitlines()
    assert text.count("Benchmarks: `bench_toy.Count.track_hazards`.") == 1
    assert text.count("Benchmarks: `bench_toy.Sum.peakmem_sum`, `bench_toy.Sum.time_sum`") == 2


@uses_asv_run
@pytest.mark.parametrize("keep", [600, 20], ids=["header-kept", "header-lost"])
def test_a_truncated_newest_file_is_named_and_the_older_commit_shown_in_its_place_says_so(
    project, tmp_path, caplog, keep
):
    copy = damaged_copy(project, tmp_path)
    path = result_file(copy, project.second_commit)
    path.write_bytes(path.read_bytes()[:keep])
    relative = path.relative_to(copy).as_posix()
    with caplog.at_level(logging.WARNING):
        text = report.write_report(copy, tmp_path / "report").read_text(encoding="utf-8")
    left_out = section(text, "## Left out of this report")
    assert f"- {relative}: the whole file left out: Error parsing JSON: " in left_out
    if keep == 600:
        stand_in = (
            f"toybox, environment {path.stem.split('-', 1)[1]}: shows commit {project.first_commit[:8]} in place of "
            f"the newer commit {project.second_commit[:8]}, whose file {relative} could not be read"
        )
    else:
        stand_in = (
            f"toybox, environment {path.stem.split('-', 1)[1]}: shows commit {project.first_commit[:8]}; {relative} "
            f"(commit {project.second_commit[:8]}) could not be read and may hold newer results"
        )
    assert f"- {stand_in}" in left_out
    run = section(text, f"### env {path.stem.split('-', 1)[1]}, commit {project.first_commit[:8]}")
    assert f"- **an older commit is shown**: {stand_in}" in run
    assert pitfalls_warnings(caplog) == [
        f"pitfalls report: {relative}: the whole file left out: " + left_out.split("left out: ", 1)[1].split("\n")[0],
        f"pitfalls report: {stand_in}",
    ]


@pytest.mark.cuda_build
@uses_asv_run
def test_the_command_line_reports_damaged_results_with_one_warning_line_each_and_no_traceback(project, tmp_path):
    copy = damaged_copy(project, tmp_path)
    path = result_file(copy, project.second_commit, second=True)
    path.write_bytes(path.read_bytes()[:600])
    rename_single_to_ghost(result_file(copy, project.second_commit))
    done = subprocess.run(
        [str(PITFALLS), "report", "--results", str(copy), "--out", str(tmp_path / "report")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    # One line on stderr for the unreadable file; the renamed benchmark is not an error.
    (warning,) = done.stderr.splitlines()
    assert warning.startswith(f"pitfalls report: {path.relative_to(copy).as_posix()}: the whole file left out: ")
    assert "report written to" in done.stdout

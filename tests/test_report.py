"""`pitfalls.report`: real asv results (from a small asv project run here) to markdown tables and PNG charts."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import matplotlib.image
import pytest
from asv import util as asv_util

from pitfalls import report, report_charts
from pitfalls.report import Row

ASV = Path(sys.executable).with_name("asv")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# The tests that read the toy project share one module-scoped asv run of several seconds.
uses_asv_run = pytest.mark.slow

# A toy suite shaped like the real one: a variant x size x device x mode class with time_, peakmem_ and a speedup
# track_, where every cuda case and one cpu case skip in setup; and a class with other params whose track_ fails
# for one case.
TOY_SUITE = """
class Sum:
    param_names = ["variant", "n", "device", "mode"]
    params = [["naive", "fast"], [10, 100, 1000], ["cpu", "cuda"], ["eager", "compiled"]]

    def setup(self, variant, n, device, mode):
        if device == "cuda":
            raise NotImplementedError("no CUDA device")
        if (variant, n, mode) == ("fast", 100, "compiled"):
            raise NotImplementedError("not on this machine")
        self.data = list(range(n))

    def time_sum(self, variant, n, device, mode):
        sum(self.data)

    def peakmem_sum(self, variant, n, device, mode):
        sum(self.data)

    def track_speedup(self, variant, n, device, mode):
        return 1.0 if variant == "naive" else 2.5

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


@dataclass(frozen=True)
class Project:
    results: Path
    first_commit: str
    second_commit: str


def _git(root: Path, *args: str, env: dict[str, str]) -> str:
    done = subprocess.run(["git", "-C", str(root), *args], env=env, check=True, capture_output=True, text=True)
    return done.stdout.strip()


def _asv(root: Path, *args: str, env: dict[str, str]) -> None:
    done = subprocess.run(
        [str(ASV), *args], cwd=root, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    # asv exits 2 when a benchmark failed, which the toy suite does on purpose.
    assert done.returncode in (0, 2), done.stdout + done.stderr


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
    (root / "asv.conf.json").write_text(
        '{"version": 1, "project": "toy", "repo": ".", "dvcs": "git", "branches": ["HEAD"], '
        '"environment_type": "existing", "benchmark_dir": "benchmarks", "results_dir": "results", '
        '"html_dir": "html", "env_dir": "env", "launch_method": "forkserver"}'
    )
    # A second interpreter path makes a second asv environment ("existing-py_..._python2nd") without installing.
    second = root / "python2nd"
    second.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    second.chmod(0o755)
    _git(root, "init", "-q", ".", env=env)
    _git(root, "add", "-A", env=env)
    _git(root, "commit", "-qm", "one", env=env)
    first = _git(root, "rev-parse", "HEAD", env=env)
    _asv(
        root, "machine", "--yes", "--machine", "toybox", "--cpu", "Toy CPU", "--num_cpu", "2", "--os", "Linux", env=env
    )
    # The older commit runs one class only: enough to tell commits apart, and quicker.
    _asv(
        root,
        "run",
        "-E",
        "existing:same",
        "-b",
        "Count",
        "--quick",
        "--set-commit-hash",
        first,
        "--machine",
        "toybox",
        env=env,
    )
    (root / "NOTES").write_text("a later commit\n")
    _git(root, "add", "-A", env=env)
    _git(root, "commit", "-qm", "two", env=env)
    second_commit = _git(root, "rev-parse", "HEAD", env=env)
    _asv(
        root,
        "run",
        "-E",
        "existing:same",
        "-E",
        f"existing:{second}",
        "--quick",
        "--set-commit-hash",
        second_commit,
        "--machine",
        "toybox",
        env=env,
    )
    return Project(root / "results", first, second_commit)


@pytest.fixture(scope="module")
def rows(project) -> list[Row]:
    return report.load_results(project.results)


def one_env(rows: list[Row], *, second: bool = False) -> list[Row]:
    envs = sorted({r.env for r in rows}, key=lambda e: e.endswith("python2nd"))
    return [r for r in rows if r.env == envs[1 if second else 0]]


def find(rows: list[Row], figure: str, **params) -> Row:
    (match,) = [r for r in rows if r.figure == figure and all(r.params[k] == v for k, v in params.items())]
    return match


# ------------------------------------------------------------------------------------------------ loading


@uses_asv_run
def test_rows_carry_values_units_and_typed_params(project, rows):
    mine = one_env(rows)
    assert {r.commit for r in rows} == {project.second_commit}
    assert len({r.env for r in rows}) == 2
    # One row per benchmark and parameter combination: 3 figures x 24 cases of Sum, 4 of Single, Gpu, Count.
    assert len(mine) == 3 * 24 + 4 + 4 + 4
    speedup = find(mine, "track_speedup", variant="fast", n=1000, device="cpu", mode="eager")
    assert (speedup.value, speedup.unit, speedup.status, speedup.kind) == (2.5, "x", "ok", "track")
    assert speedup.params == {"variant": "fast", "n": 1000, "device": "cpu", "mode": "eager"}
    assert find(mine, "track_speedup", variant="naive", n=10, device="cpu", mode="compiled").value == 1.0
    assert find(mine, "track_hazards", variant="naive", n=100).value == 3.0
    assert find(mine, "track_hazards", variant="fast", n=10).value == 0.0
    assert find(mine, "track_hazards", variant="fast", n=10).unit == "hazards/call"
    timed = find(mine, "time_sum", variant="naive", n=10, device="cpu", mode="eager")
    assert timed.unit == "seconds" and timed.kind == "time" and 0 < timed.value < 1
    memory = find(mine, "peakmem_sum", variant="naive", n=10, device="cpu", mode="eager")
    assert memory.unit == "bytes" and memory.value > 1e6
    assert {r.family for r in rows} == {"toy"}
    assert mine[0].machine == "toybox" and mine[0].machine_facts["cpu"] == "Toy CPU"
    assert mine[0].torch is None  # asv knows no torch version for an environment outside its matrix


@uses_asv_run
def test_skipped_and_failed_cases_have_no_value_and_say_which(rows):
    mine = one_env(rows)
    for figure in ("time_sum", "peakmem_sum", "track_speedup"):
        skipped = find(mine, figure, variant="fast", n=100, device="cpu", mode="compiled")
        assert (skipped.value, skipped.status) == (None, "skipped")
        cuda = [r for r in mine if r.figure == figure and r.params["device"] == "cuda"]
        assert len(cuda) == 12 and all(r.value is None and r.status == "skipped" for r in cuda)
    failed = find(mine, "track_hazards", variant="naive", n=10)
    assert (failed.value, failed.status) == (None, "failed")
    measured = [r for r in mine if r.status == "ok"]
    assert measured and all(isinstance(r.value, float) for r in measured)


@uses_asv_run
def test_newest_commit_by_default_and_a_commit_prefix_selects_another(project, rows):
    older = report.load_results(project.results, commit=project.first_commit[:7])
    assert {r.commit for r in older} == {project.first_commit}
    assert len({r.env for r in older}) == 1  # the first commit ran in one environment, one class only
    assert {r.benchmark for r in older} == {"bench_toy.Count.track_hazards"}
    assert {r.commit for r in rows} == {project.second_commit}


@uses_asv_run
def test_without_benchmarks_json_units_come_from_the_names(project, tmp_path):
    copy = tmp_path / "results"
    shutil.copytree(project.results, copy)
    (copy / "benchmarks.json").unlink()
    rows = one_env(report.load_results(copy))
    timed = [r for r in rows if r.figure == "time_sum"]
    assert {r.unit for r in timed} == {"seconds"} and {r.kind for r in timed} == {"time"}
    # asv's own default names for parameters whose names it no longer knows.
    assert list(timed[0].params) == ["param1", "param2", "param3", "param4"]
    assert find(rows, "track_speedup", param1="fast", param2=1000, param3="cpu", param4="eager").value == 2.5


@uses_asv_run
def test_machine_filter(project, rows):
    assert report.load_results(project.results, machine="toybox") == rows


@uses_asv_run
def test_unknown_machine_names_the_folder_and_the_known_ones(project):
    with pytest.raises(ValueError, match="machine='elsewhere'") as error:
        report.load_results(project.results, machine="elsewhere")
    assert "toybox" in str(error.value) and str(project.results) in str(error.value)


@uses_asv_run
def test_unknown_commit_lists_the_commits_with_results(project):
    with pytest.raises(ValueError, match="commit='deadbeef'") as error:
        report.load_results(project.results, commit="deadbeef")
    assert project.first_commit[:8] in str(error.value) and project.second_commit[:8] in str(error.value)


def test_a_folder_without_results_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="holds no asv results") as error:
        report.load_results(tmp_path)
    assert str(tmp_path) in str(error.value)
    with pytest.raises(ValueError, match="is not a folder"):
        report.load_results(tmp_path / "missing")
    with pytest.raises(TypeError, match="results_dir"):
        report.load_results(42)


# ----------------------------------------------------------------------------------------------- markdown


def table_line(markdown: str, *cells: str) -> list[str]:
    """The cells of the one table line that starts with these cells."""
    prefix = "| " + " | ".join(cells) + " |"
    (line,) = [line for line in markdown.splitlines() if line.startswith(prefix)]
    return [cell.strip() for cell in line.strip("|").split("|")]


@uses_asv_run
def test_markdown_shows_numbers_for_measured_cases_and_na_for_skipped(project, rows):
    mine = one_env(rows)
    text = report.summary_markdown(mine)
    header = table_line(text, "variant", "n", "device", "mode")
    assert header[4:] == ["time per call", "speedup over naive", "peak host memory"]
    cells = table_line(text, "fast", "1000", "cpu", "eager")
    timed = find(mine, "time_sum", variant="fast", n=1000, device="cpu", mode="eager").value
    memory = find(mine, "peakmem_sum", variant="fast", n=1000, device="cpu", mode="eager").value
    assert cells[4:] == [asv_util.human_value(timed, "seconds"), "2.5x", asv_util.human_value(memory, "bytes")]
    assert table_line(text, "fast", "100", "cpu", "compiled")[4:] == ["n/a", "n/a", "n/a"]
    assert table_line(text, "naive", "10", "cpu", "eager")[5] == "1x"
    # Every cuda case is n/a: said once, not as 12 lines of n/a.
    assert "n/a (skipped) for every case with device=cuda (12 cases)" in text
    assert not [line for line in text.splitlines() if line.startswith("| ") and "| cuda |" in line]
    # The other class's table: its own params, the failure shown as such.
    assert "| variant | n | hazards (hazards/call) |" in text.splitlines()
    lines = text.splitlines()
    # A class skipped in every case gets one line, not a table of n/a.
    assert "GPU busy: n/a (skipped) for every case (4 cases)." in lines
    assert "| naive | 10 | failed |" in lines
    assert "| naive | 100 | 3 |" in lines and "| fast | 10 | 0 |" in lines
    for needed in ("toybox", project.second_commit, "Toy CPU", "torch: not recorded"):
        assert needed in text


@uses_asv_run
def test_two_environments_at_one_commit_get_a_comparison_table(rows):
    text = report.summary_markdown(rows)
    assert "## Across torch versions" in text
    comparison = text.split("## Across torch versions", 1)[1]
    header = table_line(comparison, "variant", "n", "device", "mode")
    envs = [h.removeprefix("time, env ") for h in header[4:6]]
    assert sorted(envs) == sorted({r.env for r in rows}) and header[6] == "ratio"
    first, second = ([r for r in rows if r.env == env] for env in envs)
    a = find(first, "time_sum", variant="naive", n=1000, device="cpu", mode="eager").value
    b = find(second, "time_sum", variant="naive", n=1000, device="cpu", mode="eager").value
    cells = table_line(comparison, "naive", "1000", "cpu", "eager")
    assert cells[4:] == [asv_util.human_value(a, "seconds"), asv_util.human_value(b, "seconds"), f"{b / a:.2f}"]
    assert table_line(comparison, "fast", "100", "cpu", "compiled")[4:] == ["n/a", "n/a", "n/a"]
    assert "n/a (skipped) in every environment for every case with device=cuda (12 cases)." in comparison
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


def chart_of(charts: list[report_charts.Chart], figure: str) -> report_charts.Chart:
    (chart,) = [c for c in charts if c.name.startswith(f"toy-{figure}-")]
    return chart


@uses_asv_run
def test_time_chart_is_log_log_over_n_and_leaves_the_skipped_point_out(rows):
    mine = one_env(rows)
    chart = chart_of(report_charts.build_charts(mine), "time_sum")
    assert (chart.kind, chart.xlog, chart.ylog) == ("line", True, True)
    assert chart.xlabel.startswith("n") and "time per call (" in chart.ylabel
    assert "toybox" in chart.subtitle
    # The cuda panel had nothing measured: no panel, but said under the chart.
    assert [p.title for p in chart.panels] == ["device=cpu"]
    assert any("device=cuda" in note for note in chart.notes)
    assert any("n=100 [device=cpu]: fast, compiled" in note for note in chart.notes)
    series = {s.label: s for s in chart.panels[0].series}
    assert set(series) == {"naive, eager", "naive, compiled", "fast, eager", "fast, compiled"}
    assert [x for x, _ in series["fast, compiled"].points] == [10.0, 1000.0]
    assert series["fast, compiled"].missing == (100.0,)
    assert [x for x, _ in series["naive, eager"].points] == [10.0, 100.0, 1000.0]

    figure = report_charts.render(chart)
    (ax,) = [a for a in figure.axes if a.get_visible()]
    drawn = [line for line in ax.get_lines() if line.get_gid() == "fast, compiled"]
    # Two separate pieces, so no line is drawn across the skipped n=100.
    assert sorted(list(line.get_xdata()) for line in drawn) == [[10.0], [1000.0]]
    scale = find(mine, "time_sum", variant="fast", n=10, device="cpu", mode="compiled").value / drawn[0].get_ydata()[0]
    for line in ax.get_lines():
        for x, y in zip(line.get_xdata(), line.get_ydata()):
            variant, mode = line.get_gid().split(", ")
            row = find(mine, "time_sum", variant=variant, n=int(x), device="cpu", mode=mode)
            assert y * scale == pytest.approx(row.value)


@uses_asv_run
def test_speedup_chart_draws_a_bar_per_measured_case_and_none_for_skipped(rows):
    chart = chart_of(report_charts.build_charts(one_env(rows)), "track_speedup")
    assert chart.kind == "bar" and chart.reference == 1.0 and "speedup over naive" in chart.ylabel
    assert chart.categories == ("n=10", "n=100", "n=1k")
    # The cuda panels had nothing measured; each mode gets its own panel.
    assert [p.title for p in chart.panels] == ["device=cpu, mode=eager", "device=cpu, mode=compiled"]
    eager, compiled = ({s.label: s for s in p.series} for p in chart.panels)
    assert set(eager) == set(compiled) == {"fast"}  # the baseline is the reference line, not a bar
    assert eager["fast"].points == ((0.0, 2.5), (1.0, 2.5), (2.0, 2.5)) and eager["fast"].missing == ()
    assert compiled["fast"].points == ((0.0, 2.5), (2.0, 2.5)) and compiled["fast"].missing == (1.0,)

    figure = report_charts.render(chart)
    compiled_ax = next(a for a in figure.axes if a.get_title() == "device=cpu, mode=compiled")
    bars = [p for p in compiled_ax.patches if p.get_gid() == "fast"]
    assert sorted(bar.get_x() + bar.get_width() / 2 for bar in bars) == pytest.approx([0.0, 2.0])
    assert all(bar.get_height() == pytest.approx(2.5) and bar.get_y() == 0 for bar in bars)
    assert [t.get_text() for t in compiled_ax.texts] == ["2.5x", "2.5x", "n/a"]  # bar labels, then the gap
    assert [line.get_ydata()[0] for line in compiled_ax.get_lines()] == [1.0]  # the reference line


@uses_asv_run
def test_time_chart_without_a_size_sweep_is_a_bar_chart_of_the_variants(rows):
    mine = one_env(rows)
    chart = chart_of(report_charts.build_charts(mine), "time_single")
    assert (chart.kind, chart.categories, chart.xlabel) == ("bar", ("naive", "fast"), "variant")
    (panel,) = chart.panels
    assert panel.title == "batch=4"
    eager = next(s for s in panel.series if s.label == "eager")
    unit_scale = find(mine, "time_single", variant="fast", mode="eager").value / eager.points[1][1]
    assert [x for x, _ in eager.points] == [0.0, 1.0]
    assert any(unit_scale == pytest.approx(scale) for scale in (1.0, 1e-3, 1e-6, 1e-9))


@uses_asv_run
def test_charts_are_valid_pngs(rows, tmp_path):
    paths = report.charts(rows, tmp_path / "charts")
    assert len(paths) == 6  # two time charts and a speedup chart, in each of the two environments
    for path in paths:
        assert path.parent == tmp_path / "charts" and path.suffix == ".png"
        data = path.read_bytes()
        assert data.startswith(PNG_SIGNATURE) and len(data) > 1000
        image = matplotlib.image.imread(path)
        assert image.ndim == 3 and image.shape[0] > 200 and image.shape[1] > 200


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
    assert len(pngs) == 6 and all(f"]({name})" in text for name in pngs)
    assert "| fast | 100 | cpu | compiled | n/a | n/a | n/a |" in text


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

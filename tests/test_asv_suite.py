"""The asv suite itself: its configuration, its coverage of the registry, its skips, and a real asv run."""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import subprocess
import sys
import timeit
from pathlib import Path

import pytest
import torch
from asv import util as asv_util
from asv.config import Config
from asv_runner.benchmarks.mark import SkipNotImplemented
from suite import import_suite_module

from pitfalls import measure, registry
from pitfalls.cases import SkipCase
from pitfalls.grids import DEFAULT_GRID, GRID_NAMES
from pitfalls.probes import Unavailable

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "asv.conf.json"
ASV = Path(sys.executable).with_name("asv")


common = import_suite_module("common")
shapes = import_suite_module("shapes")
MODULES = {entry.name: import_suite_module(f"bench_{entry.name}") for entry in registry.BUILTIN}
bench_loss, bench_sampler = MODULES["loss"], MODULES["sampler"]


def asv_known_keys() -> set[str]:
    """Every asv.conf.json key asv 0.6.6 reads: Config's attributes, "version", and keys read by getattr."""
    known = set(vars(Config())) | {"version"}
    package = Path(asv_util.__file__).parent
    pattern = re.compile(r"getattr\(\s*(?:self\.)?_?conf(?:ig)?\s*,\s*['\"](\w+)['\"]")
    for source in package.rglob("*.py"):
        known |= set(pattern.findall(source.read_text(encoding="utf-8")))
    return known


def load_conf() -> dict:
    # asv's own loader: it strips the // comments exactly as asv does.
    return asv_util.load_json(str(CONF), js_comments=True)


def test_every_conf_key_is_one_asv_reads():
    unknown = set(load_conf()) - asv_known_keys()
    assert not unknown, f"asv silently ignores these asv.conf.json keys: {sorted(unknown)}"


def test_the_key_check_would_catch_a_misspelt_key():
    known = asv_known_keys()
    assert "regressions_thresholds" in known and "build_cache_size" in known
    # pandas shipped the first spelling for years; asv never read it.
    assert "regression_thresholds" not in known
    assert "launch-method" not in known


def test_conf_loads_with_asv_and_sets_what_the_suite_relies_on():
    conf = Config.load(str(CONF))
    assert conf.launch_method == "forkserver"
    assert conf.environment_type == "virtualenv"
    assert (ROOT / conf.benchmark_dir / "__init__.py").is_file()
    assert conf.matrix["req"]["torch"], "the torch matrix drives the history runs"
    # Each commit is measured as built from that commit: never an editable install of the working tree.
    for command in conf.build_command + conf.install_command:
        assert not re.search(r"(^|\s)(-e|--editable)(\s|$)", command), command
    assert any("{wheel_file}" in command for command in conf.install_command)


def test_every_built_in_family_has_a_benchmark_module():
    assert set(MODULES) == {entry.name for entry in registry.BUILTIN}
    for family in MODULES:
        assert (ROOT / "benchmarks" / f"bench_{family}.py").is_file()


def benchmark_classes(module):
    """The module's benchmark classes that sweep its family's cases (not those with axes of their own only, such as
    issue 13246's records or the calibration table's checks)."""
    return [
        obj
        for obj in vars(module).values()
        if isinstance(obj, type) and obj.__module__ == module.__name__ and not obj.__name__.startswith("_")
        and issubclass(obj, common.FamilyBenchmark)
    ]


@pytest.mark.parametrize("family", MODULES)
def test_every_variant_and_the_floor_are_benchmarked_by_every_class(family):
    classes = benchmark_classes(MODULES[family])
    assert classes
    for cls in classes:
        assert len(cls.params) == len(cls.param_names), cls.__name__
        variants = cls.params[cls.param_names.index("variant")]
        assert list(variants) == list(registry.family(family).cases), cls.__name__
        assert variants[0] == registry.baseline(family)
        assert (variants[-1] == "floor") == registry.family(family).floor


# The shared class of each figure, as the modules name them.
FIGURE_CLASSES = {"speedup": "Speedup", "hazards": "SyncHazards", "compile": "Compile", "cuda": "Cuda",
                  "nvml": "Nvml"}


@pytest.mark.parametrize("family", MODULES)
def test_a_module_has_the_class_of_every_figure_its_family_has_and_no_other(family):
    names = {cls.__name__ for cls in benchmark_classes(MODULES[family])}
    wanted = {FIGURE_CLASSES[f] for f in registry.family(family).figures if f in FIGURE_CLASSES}
    assert wanted <= names
    assert not (set(FIGURE_CLASSES.values()) - wanted) & names


@pytest.mark.parametrize("family", MODULES)
def test_the_class_axes_are_the_familys_grid(family):
    axes = list(registry.family(family).axes(common.GRID.name))
    for cls in benchmark_classes(MODULES[family]):
        swept = cls.sweep_axis
        # A class may add axes of its own after the family's (the loader's Verdict: the planted step cost).
        own = list(cls.extra_axes)
        assert cls.param_names[len(cls.param_names) - len(own):] == own
        family_axes = [n for n in cls.param_names if n not in ("variant", "device", "mode", *own)]
        assert family_axes == [a for a in axes if a != swept]


def test_speedup_is_over_the_naive_variant_run_eagerly():
    speedup = bench_sampler.Speedup()
    speedup.setup("static", 1000, 1, "cpu", "compiled")
    assert (speedup.naive_case.variant, speedup.naive_case.compiled) == ("nonzero", False)
    assert (speedup.case.variant, speedup.case.compiled) == ("static", True)


def test_the_quick_grid_times_a_compiled_case_on_a_gpu_only_and_says_why():
    sample = bench_sampler.Sample()
    assert common.GRID.name == "quick"
    with pytest.raises(NotImplementedError, match="compiled speedup and compile table measure it"):
        sample.setup("static", 1000, 1, "cpu", "compiled")
    assert not hasattr(sample, "case")  # skipped before the case (and inductor) was built
    sample.setup("static", 1000, 1, "cpu", "eager")
    assert (sample.case.variant, sample.case.compiled) == ("static", False)
    if not torch.cuda.is_available():
        with pytest.raises(NotImplementedError, match="no CUDA device"):
            sample.setup("static", 1000, 1, "cuda", "compiled")


def test_units_name_what_one_call_of_the_family_is():
    assert bench_loss.SyncHazards.track_sync_hazards.unit == "hazards/step"
    assert bench_sampler.SyncHazards.track_sync_hazards.unit == "hazards/call"
    assert bench_loss.Cuda.track_cuda_syncs.unit == "syncs/step"
    # Each class owns its copy of a figure its shape defines: the shape keeps no unit of one family.
    assert bench_loss.Cuda.track_cuda_syncs is not shapes.Cuda.track_cuda_syncs
    assert not hasattr(shapes.Cuda.track_cuda_syncs, "unit")


def test_no_two_classes_share_a_setup_cache():
    # asv keys setup_cache results by module and line: a shared key would hand one family's table to another.
    from asv_runner.benchmarks._base import get_setup_cache_key

    cached = [cls.setup_cache for module in MODULES.values() for cls in benchmark_classes(module)
              if hasattr(cls, "setup_cache")]
    assert len(cached) >= len([f for f in registry.BUILTIN if "compile" in f.figures])
    assert len({get_setup_cache_key(method) for method in cached}) == len(cached)


def test_the_committed_history_keeps_its_series(committed_inputs):
    # asv publishes a result only while its benchmark's version is unchanged (a hash of the source, unless
    # pinned): every benchmark in the committed results/ (HEAD's) must still exist under its name, with the version
    # it was run at, or one its pin restarted from.
    script = (
        "import sys\n"
        "from asv_runner._aux import update_sys_path\n"
        "from asv_runner.discovery import disc_benchmarks\n"
        "update_sys_path(sys.argv[1])\n"
        "for b in disc_benchmarks(sys.argv[1], ignore_import_errors=False):\n"
        "    print(b.name, b.version)\n"
    )
    done = subprocess.run([sys.executable, "-c", script, str(ROOT / "benchmarks")], capture_output=True, text=True,
                          timeout=300, check=True)
    suite = dict(line.split() for line in done.stdout.splitlines())
    # A restarted series (scripts/series restart) keeps its earlier results under the version it replaced.
    from pitfalls.series_guard import load_pins

    earlier = {name: {r["previous"] for r in pin.restarts} for name, pin in load_pins().items()}
    # Series that ended (their results stay in the history they made).
    retired = {name for module in MODULES.values() for name in getattr(module, "RETIRED", ())}
    checked = 0
    for path in sorted((committed_inputs / "results").glob("*/*.json")):
        if path.name == "machine.json":
            continue
        data = json.loads(path.read_text())
        version = data["result_columns"].index("version")
        for name, row in data["results"].items():
            if name in retired:
                continue
            assert name in suite, f"{path.name}: {name} is no longer in the suite"
            assert row[version] == suite[name] or row[version] in earlier.get(name, ()), (
                f"{path.name}: {name} was run at another version")
            checked += 1
    assert checked >= 23


def test_ddp_scaling_reads_the_same_case_at_one_rank_from_the_figures_table():
    from pitfalls.families.parallel import DDP, ParallelFigures

    bench = MODULES["parallel"]
    names = list(bench.Ranks.param_names)
    sizes = {"variant": DDP, "batch": 4, "image_size": 64, "model": "segnet", "device": "cpu"}
    one, two = (tuple({**sizes, "world_size": w}[name] for name in names) for w in (1, 2))
    table = {one: ParallelFigures(0.1, 40.0, Unavailable("x"), Unavailable("x"), Unavailable("x")),
             two: ParallelFigures(0.1, 60.0, Unavailable("x"), Unavailable("x"), Unavailable("x"))}
    ranks = bench.Ranks()
    ranks.setup(table, *two)
    assert ranks.track_scaling_efficiency(table, *two) == pytest.approx(0.75)
    assert bench.one_rank_key(dict(zip(names, two, strict=True))) == one


def test_device_axis_covers_cpu_and_cuda_whatever_this_machine_has():
    # Results stay comparable across machines: a missing device is a skipped column, not a missing one.
    for module in MODULES.values():
        for cls in benchmark_classes(module):
            if "device" in cls.param_names:
                assert list(cls.params[cls.param_names.index("device")]) == ["cpu", "cuda"]


def test_grid_is_chosen_by_env_var_and_quick_is_a_subset_of_full():
    assert common.grid({}).name == "quick"
    for entry in registry.all_families().values():
        quick, full = entry.axes("quick"), entry.axes("full")
        for axis, values in quick.items():
            assert set(values) <= set(full[axis]), (entry.name, axis)
    assert max(registry.family("sampler").axes("full")["n"]) == 10_000_000
    assert registry.family("loss").axes("full") == {"batch": (4, 32, 256), "image_size": (64, 256)}


def test_rounds_can_be_raised_for_interleaved_comparisons():
    assert common.grid({"PITFALLS_GRID": "quick", "PITFALLS_ROUNDS": "3"}).rounds == 3
    assert common.grid({"PITFALLS_GRID": "quick"}).rounds == common.GRIDS["quick"].rounds
    with pytest.raises(ValueError, match=r"PITFALLS_ROUNDS='0'.*integer >= 1"):
        common.grid({"PITFALLS_ROUNDS": "0"})


def test_an_unknown_grid_is_refused_naming_the_variable_and_the_choices():
    with pytest.raises(ValueError, match=r"PITFALLS_GRID='huge'.*quick, full"):
        common.grid({"PITFALLS_GRID": "huge"})


def test_the_suites_grids_are_the_ones_the_runner_allows():
    # The main job refuses a grid by these names before asv imports the suite (pitfalls.grids).
    assert tuple(common.GRIDS) == GRID_NAMES and DEFAULT_GRID in GRID_NAMES
    for entry in registry.all_families().values():
        assert set(entry.grids) == set(GRID_NAMES), entry.name


def test_a_case_that_cannot_run_becomes_a_skip_with_its_reason():
    with pytest.raises(NotImplementedError, match="needs about 9.0 GiB"):
        with common.skipping():
            raise SkipCase("needs about 9.0 GiB")


def test_an_unavailable_figure_skips_the_method_and_a_measured_zero_stays_zero(capsys):
    assert common.figure(0) == 0
    with pytest.raises(SkipNotImplemented, match="no CUDA device"):
        common.figure(Unavailable("no CUDA device"))
    assert "no CUDA device" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the skip on a machine without CUDA")
def test_cuda_only_setup_skips_with_the_reason_on_a_cpu_machine():
    with pytest.raises(NotImplementedError, match="CUDA"):
        bench_loss.Cuda().setup("naive", 4, 64, "eager")
    with pytest.raises(NotImplementedError, match="CUDA"):
        bench_sampler.Sample().setup("static", 1000, 1, "cuda", "eager")


def test_cases_are_built_once_per_process():
    # asv-runner calls setup() before every timed call: the second setup must reuse the built case.
    first, second = bench_sampler.Sample(), bench_sampler.Sample()
    first.setup("static", 1000, 1, "cpu", "eager")
    second.setup("static", 1000, 1, "cpu", "eager")
    assert first.case is second.case


def test_a_mode_outside_the_axis_is_refused():
    with pytest.raises(ValueError, match=r"mode='jit'.*eager, compiled"):
        measure.compiled("jit")


@pytest.mark.cuda_build
def test_discovering_the_suite_never_touches_cuda():
    # asv's forkserver imports the suite once and forks every benchmark from it: a CUDA query at import time
    # (even is_available) would leave every child with a CUDA state it cannot use. Discover the suite as the
    # server does, in a fresh interpreter where every such call raises.
    script = """
import sys, torch
def queried(name):
    # One function per name: torch._dynamo (imported by the suite) maps each torch function to a rule, and one
    # object standing for two functions with different rules stops its import.
    def call(*args, **kwargs):
        raise RuntimeError(f"CUDA was queried ({name}) while importing the suite")
    return call
for name in ("is_available", "device_count", "init", "_lazy_init", "current_device", "get_device_name",
             "get_device_properties", "mem_get_info", "synchronize", "set_device"):
    setattr(torch.cuda, name, queried(name))
from asv_runner._aux import update_sys_path
from asv_runner.discovery import disc_benchmarks
update_sys_path(sys.argv[1])
names = [b.name for b in disc_benchmarks(sys.argv[1], ignore_import_errors=False)]
print(len(names), "benchmarks")
"""
    done = subprocess.run(
        [sys.executable, "-c", script, str(ROOT / "benchmarks")], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert int(done.stdout.split()[0]) > 10


def test_compile_table_keeps_the_reason_where_a_case_cannot_be_compiled_here():
    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA")
    table = measure.compile_table("sampler", ["variant", "batch", "device"], [["static"], [1], ["cuda"]],
                                  sweep=("n", (1000, 2000)))
    assert table == {("static", 1, "cuda"): "no CUDA device"}
    with pytest.raises(SkipCase, match="no CUDA device"):
        measure.lookup(table, ("static", 1, "cuda"))


@pytest.mark.slow
def test_static_sampler_compiles_into_one_graph_and_a_size_sweep_reuses_a_dynamic_one():
    # The article's point about the static form, measured: no graph break; with dynamic=None the second N
    # recompiles once (as dynamic) and the third reuses that graph.
    sweep = [{"n": n, "batch": 1} for n in (1000, 2000, 4000)]
    figures = measure.compile_figures("sampler", "static", "cpu", sweep)
    assert figures.graph_breaks == 0
    assert figures.recompiles == 1
    # A first compile with cold caches takes seconds; one steady call of this case takes well under a millisecond.
    case = measure.case("sampler", "static", "cpu", "eager", n=1000, batch=1)
    steady = min(timeit.repeat(case, number=10, repeat=3)) / 10
    assert figures.compile_s > 100 * steady


@pytest.mark.slow
def test_the_naive_loss_breaks_its_graph_and_ignore_index_does_not():
    # The counts the committed history holds for torch 2.13 (bench_loss.Compile.track_graph_breaks): dynamo
    # breaks at the data-dependent ops of the naive loss; the ignore_index loss is one graph.
    assert measure.compile_figures("loss", "naive", "cpu", [{"batch": 2, "image_size": 16}]).graph_breaks == 5
    assert measure.compile_figures("loss", "ignore_index", "cpu", [{"batch": 2, "image_size": 16}]).graph_breaks == 0


# --- asv itself ---------------------------------------------------------------------------------------------


def run_asv(*args: str, cwd: Path, timeout: float, home: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PITFALLS_GRID": "quick"}
    if home is not None:
        # asv keeps its machine records in ~/.asv-machine.json: a test must not add one to the user's.
        env["HOME"] = str(home)
    return subprocess.run(
        [str(ASV), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.mark.slow
def test_asv_check_finds_no_problem():
    # -E existing:same rather than --python=same: asv 0.6.6 turns the latter into one environment per matrix entry.
    done = run_asv("check", "-E", "existing:same", cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "No problems found" in done.stdout


SMOKE = {
    # benchmark -> the parameter sets run (asv's -b matches "name(param, ...)")
    "bench_loss.Step.time_step": ["'naive', 4, 64, '{device}', 'eager'"],
    "bench_loss.Step.peakmem_step": ["'ignore_index', 4, 64, '{device}', 'eager'"],
    "bench_loss.Speedup.track_speedup": ["'ignore_index', 4, 64, '{device}', 'eager'"],
    "bench_loss.SyncHazards.track_sync_hazards": ["'naive', 4, 64, '{device}'", "'ignore_index', 4, 64, '{device}'"],
    "bench_loss.Cuda.track_cuda_syncs": ["'naive', 4, 64, 'eager'"],
    "bench_loss.Nvml.track_gpu_busy": ["'naive', 4, 64, 'eager'"],
    "bench_sampler.Sample.time_sample": ["'static', 1000, 1, '{device}', 'compiled'"],
    "bench_sampler.Speedup.track_speedup": ["'static', 1000, 1, '{device}', 'compiled'"],
}
# Timed on the quick grid on a GPU only: on a CPU the compiled speedup above reads the compiled case.
QUICK_CPU_SKIPS = {("bench_sampler.Sample.time_sample", "cpu")}
CUDA_ONLY = ("bench_loss.Cuda.", "bench_loss.Nvml.")


def smoke_selection() -> list[tuple[str, str, str]]:
    """(benchmark, device, param text) for every parameter set the smoke run selects."""
    chosen = []
    for name, param_sets in SMOKE.items():
        for params in param_sets:
            devices = ("cpu", "cuda") if "{device}" in params else ("cuda",)
            chosen += [(name, device, params.format(device=device)) for device in devices]
    return chosen


@pytest.mark.slow
def test_a_quick_asv_run_records_numbers_here_and_skips_for_what_is_missing(tmp_path):
    conf = load_conf()
    for key in ("repo", "benchmark_dir", "env_dir", "html_dir"):
        conf[key] = str(ROOT / conf[key])
    conf["results_dir"] = str(tmp_path / "results")
    (tmp_path / "asv.conf.json").write_text(json.dumps(conf), encoding="utf-8")
    selection = smoke_selection()
    regexes = [f"^{re.escape(name)}\\({re.escape(params)}\\)$" for name, _, params in selection]
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
    args = ["run", "--config", str(tmp_path / "asv.conf.json"), "-E", "existing:same", "--quick", "--show-stderr",
            "--set-commit-hash", head.stdout.strip(), "--machine", "smoke"]
    run_asv("machine", "--yes", "--machine", "smoke", cwd=tmp_path, timeout=60, home=tmp_path)
    for regex in regexes:
        args += ["-b", regex]
    done = run_asv(*args, cwd=tmp_path, timeout=600, home=tmp_path)
    # asv exits 2 when any benchmark failed (and 0 when all ran or were skipped).
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-5000:]

    [results_file] = [p for p in (tmp_path / "results" / "smoke").glob("*.json") if p.name != "machine.json"]
    results = json.loads(results_file.read_text())["results"]
    assert set(results) == set(SMOKE)
    cuda = torch.cuda.is_available()
    for name, device, params in selection:
        values, param_lists = results[name][0], results[name][1]
        labels = [", ".join(combo) for combo in itertools.product(*param_lists)]
        value = values[labels.index(params)]
        assert value is not None, f"{name}({params}) failed"
        if device == "cuda" and not cuda:
            assert math.isnan(value), f"{name}({params}) has {value} without a GPU: it must be skipped (n/a)"
        elif (name, device) in QUICK_CPU_SKIPS:
            assert math.isnan(value), f"{name}({params}) has {value}: the quick grid skips it on a CPU"
        else:
            assert math.isfinite(value) and value > 0 or name.endswith("track_sync_hazards"), f"{name}({params})"
    hazards = results["bench_loss.SyncHazards.track_sync_hazards"]
    labels = [", ".join(combo) for combo in itertools.product(*hazards[1])]
    # Exactly the counts pitfalls check shows: the naive step's six hazards, none for ignore_index.
    assert hazards[0][labels.index("'naive', 4, 64, 'cpu'")] == 6
    assert hazards[0][labels.index("'ignore_index', 4, 64, 'cpu'")] == 0
    if not cuda:
        assert "asv: skipped: NotImplementedError('no CUDA device')" in done.stdout
    assert f"asv: skipped: NotImplementedError({shapes.QUICK_CPU_COMPILED!r})" in done.stdout



# --- versions, one way ---------------------------------------------------------------------------------------


def _version_writes(path: Path) -> list[str]:
    """Every place a benchmark module of the suite sets a ``version`` itself: an attribute or a name assigned, or a
    keyword argument (asv reads a method's, its class's or its module's ``version``)."""
    import ast

    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AnnAssign, ast.AugAssign)) else []
        for target in targets:
            if isinstance(target, ast.Attribute) and target.attr == "version" or \
                    isinstance(target, ast.Name) and target.id == "version":
                found.append(f"{path.name}:{node.lineno}")
        if isinstance(node, ast.keyword) and node.arg == "version":
            found.append(f"{path.name}:{node.lineno}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr" and \
                len(node.args) > 1 and isinstance(node.args[1], ast.Constant) and node.args[1].value == "version":
            found.append(f"{path.name}:{node.lineno}")
    return found


def test_every_version_comes_from_the_pins_and_none_is_written_anywhere_else(tmp_path):
    # asv reads a benchmark's version from its method, class or module: one set in a bench module would be
    # overridden by the pin (and so do nothing) or, without a pin, start a series no guard watches.
    from pitfalls.series_guard import discovered, load_pins

    written = [place for path in sorted((ROOT / "benchmarks").glob("bench_*.py")) for place in _version_writes(path)]
    assert written == [], f"versions set outside benchmarks/series.json: {written}"
    pins = load_pins()
    built_in = {name: b for name, b in discovered().items() if not name.startswith("bench_plugins.")}
    assert sorted(set(built_in) - set(pins)) == [], "benchmarks with no pin: `scripts/series pin NAME`"
    assert {name: b.version for name, b in built_in.items()} == {name: pins[name].version for name in built_in}
    # The check itself can fail: a planted `version` attribute and keyword are found.
    planted = tmp_path / "bench_planted.py"
    planted.write_text("class A:\n    def track_x(self):\n        return 1\n\n\nA.track_x.version = '2'\n"
                       "f = copy(g, version='3')\n")
    assert _version_writes(planted) == ["bench_planted.py:6", "bench_planted.py:7"]


# --- a figure's path -----------------------------------------------------------------------------------------


def files_passed(call) -> set[str]:
    """The suite's own files (under src/ and benchmarks/) whose code runs during ``call()``, by a profile hook."""
    seen: set[str] = set()

    def hook(frame, event, _arg):
        if event == "call":
            seen.add(frame.f_code.co_filename)

    sys.setprofile(hook)
    try:
        call()
    finally:
        sys.setprofile(None)
    roots = (str(ROOT / "src") + os.sep, str(ROOT / "benchmarks") + os.sep)
    return {str(Path(name).relative_to(ROOT)) for name in seen if name.startswith(roots)}


# What a published figure may pass through besides its family's own module or package (the issue of one measuring
# layer: a reader follows it from its asv method to its probe in a few files).
FIGURE_PATH = {"benchmarks/common.py", "src/pitfalls/measure.py", "src/pitfalls/devices.py", "src/pitfalls/cases.py",
               "src/pitfalls/registry.py", "src/pitfalls/family.py", "src/pitfalls/_checks.py"}


@pytest.mark.parametrize(("module", "cls", "method", "params", "family_files"), [
    ("bench_loss", "SyncHazards", "track_sync_hazards", ("naive", 4, 64, "cpu"), ("src/pitfalls/families/loss.py",)),
    ("bench_loader", "Speedup", "track_speedup", ("uint8", 0, 32, 8, "png", "list", False, "warm", "cpu"),
     ("src/pitfalls/families/loader/",)),
])
def test_a_published_figure_passes_through_its_bench_file_the_measuring_layer_and_its_probes(
        module, cls, method, params, family_files):
    bench = import_suite_module(module)
    assert f"def {method}(" in (ROOT / "benchmarks" / f"{module}.py").read_text()  # found by grep in its file

    def figure():
        benchmark = getattr(bench, cls)()
        benchmark.setup(*params)
        getattr(benchmark, method)(*params)

    passed = files_passed(figure)
    allowed = {f"benchmarks/{module}.py", *FIGURE_PATH}
    others = sorted(f for f in passed if f not in allowed and not f.startswith("src/pitfalls/probes/")
                    and not f.startswith(family_files))
    assert others == [], f"{module}.{cls}.{method} passes through {others}"
    assert "src/pitfalls/measure.py" in passed and any(f.startswith("src/pitfalls/probes/") for f in passed)

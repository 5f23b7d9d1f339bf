"""The family protocol: typed parameters, entry validation, and a user's own family added with no suite edit."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from pitfalls import cli, registry
from pitfalls.family import ALL_FIGURES, FLOOR, Case, Family, Param, SkipCase
from pitfalls.probes import count_hazards

ROOT = Path(__file__).resolve().parents[1]

# A family written in the test itself: two trivial variants and a floor, registered through the environment.
THROWAWAY = """
import torch
from pitfalls import FLOOR, Case, Family, Param, same_output

def doubled(x):
    return x + x

def scaled(x):
    return 2 * x

def floor(x):
    return x.mul(2)

FUNCTIONS = {"doubled": doubled, "scaled": scaled, FLOOR: floor}

def build(variant, device, compiled, params):
    x = torch.arange(params["n"], dtype=torch.float32, device=device)
    fn = FUNCTIONS[variant]
    run = torch.compile(fn) if compiled else fn
    return Case("throwaway", variant, device, compiled, params, lambda: run(x), fn, (x,))

FAMILY = Family(
    name="throwaway", article="test", summary="x + x against 2 * x",
    variants=("doubled", "scaled"), params=(Param("n", 64, "elements"), Param("label", "a", "a str parameter",
    choices=("a", "b")), Param("fast", False, "a bool parameter")),
    builder=build, estimate=lambda p: 4 * p["n"], comparer=same_output,
    smoke={"n": 8}, grids={"quick": {"n": (16,)}, "full": {"n": (16, 1024)}},
)
"""


@pytest.fixture
def throwaway(tmp_path, monkeypatch):
    path = tmp_path / "my_family.py"
    path.write_text(THROWAWAY, encoding="utf-8")
    monkeypatch.setenv(registry.FAMILIES_ENV, f"{path}:FAMILY")
    registry.reload()
    yield path
    monkeypatch.delenv(registry.FAMILIES_ENV)
    registry.reload()


# --- parameters -------------------------------------------------------------------------------------------------


def test_a_parameter_checks_its_type_its_range_and_its_choices():
    size = Param("image_size", 64, "pixels", minimum=8)
    assert size.flag == "--image-size" and size.kind is int
    assert size.check(8) == 8 and size.parse("32") == 32
    with pytest.raises(ValueError, match="image_size=4 is not allowed; image_size must be an int >= 8"):
        size.check(4)
    with pytest.raises(TypeError, match="image_size must be an int, got True"):
        size.check(True)
    with pytest.raises(ValueError, match="image_size='big' is not an int"):
        size.parse("big")
    storage = Param("storage", "disk", "where the data lies", choices=("disk", "ram"))
    assert storage.parse("ram") == "ram"
    with pytest.raises(ValueError, match="storage='tape' is not allowed; allowed: disk, ram"):
        storage.parse("tape")
    pinned = Param("pin_memory", False, "page-locked batches")
    assert pinned.parse("true") is True and pinned.parse("0") is False
    with pytest.raises(ValueError, match="pin_memory='maybe' is not a boolean; allowed: true, false"):
        pinned.parse("maybe")


def test_a_derived_parameter_defaults_to_none_and_needs_its_kind():
    derived = Param("num_samples", None, "K", kind=int)
    assert derived.check(None) is None and derived.parse("4") == 4
    with pytest.raises(TypeError, match="kind must be int, str or bool"):
        Param("broken", None, "no kind")


def test_a_default_the_parameter_itself_refuses_is_caught_when_the_entry_is_written():
    with pytest.raises(ValueError, match="batch=0 is not allowed"):
        Param("batch", 0, "images")


# --- entries ----------------------------------------------------------------------------------------------------


def entry(**changes):
    fields = dict(
        name="toy", article="x", summary="s", variants=("a", "b"), params=(Param("n", 4, "n"),),
        builder=lambda *a: None, estimate=lambda p: 0, comparer=lambda *a: None, smoke={"n": 2},
        grids={"quick": {"n": (2,)}},
    )
    fields.update(changes)
    return Family(**fields)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"variants": ("a",)}, "two or more distinct names"),
        ({"variants": ("a", "a")}, "two or more distinct names"),
        ({"variants": ("a", FLOOR)}, "not 'floor'"),
        ({"figures": frozenset({"time", "vibes"})}, r"unknown figures \['vibes'\]"),
        ({"grids": {"full": {"n": (2,)}}}, "grids must include 'quick'"),
        ({"grids": {"quick": {"n": (2,)}, "full": {"m": (2,)}}}, "sweep the same parameters"),
        ({"grids": {"quick": {"n": (0,)}}}, "n=0 is not allowed"),
        ({"smoke": {"m": 2}}, "toy has no parameter m; allowed: n"),
        ({"compile_sweep": "m"}, "compile_sweep 'm' is not a grid axis"),
        ({"name": "Has Space"}, "name 'Has Space'"),
    ],
)
def test_a_malformed_entry_is_refused_when_it_is_written(changes, message):
    with pytest.raises(ValueError, match=message):
        entry(**changes)


def test_an_entry_resolves_parameters_with_defaults_and_clear_errors():
    toy = entry(params=(Param("n", 4, "n"), Param("mode", "x", "m", choices=("x", "y"))))
    assert toy.resolve({}) == {"n": 4, "mode": "x"}
    assert toy.resolve({"mode": "y"}) == {"n": 4, "mode": "y"}
    with pytest.raises(ValueError, match="toy has no parameter q, r; allowed: n, mode"):
        toy.resolve({"q": 1, "r": 2})


def test_build_refuses_a_compile_the_family_cannot_do_and_a_device_that_is_absent():
    built = []
    toy = entry(figures=ALL_FIGURES - {"compile"}, builder=lambda *args: built.append(args))
    with pytest.raises(ValueError, match="the toy family has nothing to torch.compile"):
        toy.build("a", compiled=True)
    if not torch.cuda.is_available():
        with pytest.raises(SkipCase, match="no CUDA device"):
            toy.build("a", device="cuda")
    toy.build(FLOOR, n=3)
    assert built == [(FLOOR, torch.device("cpu"), False, {"n": 3})]


# --- a user's own family ----------------------------------------------------------------------------------------


def test_a_family_written_in_a_test_is_listed_checked_and_built_with_no_suite_file_edited(throwaway, capsys):
    assert "throwaway" in registry.family_names()
    assert cli.main(["list"]) == 0
    listed = capsys.readouterr().out
    assert "throwaway" in listed and "doubled, scaled" in listed and "label=a" in listed
    assert cli.main(["check", "--device", "cpu"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if "throwaway" in line]
    assert len(rows) == 2 and all(" yes " in row for row in rows)
    for variant in registry.family("throwaway").cases:
        case = registry.family("throwaway").build(variant, n=5, label="b", fast=True)
        assert isinstance(case, Case) and case.params == {"n": 5, "label": "b", "fast": True}
        assert torch.equal(case(), torch.arange(5.0) * 2)
        assert count_hazards(case).total == 0


def test_its_parameters_become_probe_flags_with_the_same_errors(throwaway, capsys):
    assert cli.main(["probe", "throwaway", "scaled", "--n", "32", "--label", "b", "--fast", "true",
                     "--rounds", "2"]) == 0
    assert "throwaway/scaled n=32 label=b fast=True cpu eager" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        cli.main(["probe", "throwaway", "scaled", "--label", "c"])
    assert exit_.value.code == 2
    assert "label='c' is not allowed; allowed: a, b" in capsys.readouterr().err


def test_the_gate_catches_a_users_variant_that_differs(tmp_path, monkeypatch, capsys):
    path = tmp_path / "broken.py"
    path.write_text(THROWAWAY.replace("return 2 * x", "return 2 * x + 1"), encoding="utf-8")
    monkeypatch.setenv(registry.FAMILIES_ENV, f"{path}:FAMILY")
    registry.reload()
    try:
        assert cli.main(["check", "--device", "cpu"]) == 1
        assert "throwaway/scaled on cpu" in capsys.readouterr().out
    finally:
        monkeypatch.delenv(registry.FAMILIES_ENV)
        registry.reload()


@pytest.mark.parametrize(
    ("target", "reason"),
    [
        ("no_such_module_here:FAMILY", "ModuleNotFoundError"),
        ("{dir}/missing.py:FAMILY", "no such file"),
        ("{dir}/my_family.py:NOPE", "has no 'NOPE'"),
        ("{dir}/my_family.py:build", "is a function, not a pitfalls.Family"),
        ("pitfalls.families.loss:FAMILY", "a family named 'loss' is already registered"),
        ("just-a-name", "is not MODULE:NAME or FILE.py:NAME"),
    ],
)
def test_a_family_that_cannot_be_loaded_is_left_out_with_the_reason(throwaway, monkeypatch, target, reason, capsys):
    monkeypatch.setenv(registry.FAMILIES_ENV, target.format(dir=throwaway.parent))
    registry.reload()
    with pytest.warns(UserWarning, match="family left out"):
        names = registry.family_names()
    assert names == tuple(entry.name for entry in registry.BUILTIN)
    assert any(reason in error for error in registry.load_errors()), registry.load_errors()
    assert cli.main(["list"]) == 0
    # rich wraps the line at the terminal's width, wherever the long tmp path puts the reason.
    assert reason in " ".join(capsys.readouterr().out.split())


def discover(families: str | None) -> list[str]:
    """The benchmark names asv discovers in benchmarks/, in a fresh interpreter with PITFALLS_FAMILIES set or not."""
    script = textwrap.dedent("""
        import sys
        from asv_runner._aux import update_sys_path
        from asv_runner.discovery import disc_benchmarks
        update_sys_path(sys.argv[1])
        for b in disc_benchmarks(sys.argv[1], ignore_import_errors=False):
            print(b.name, getattr(b, "unit", ""), b.param_names)
    """)
    env = {k: v for k, v in os.environ.items() if k != registry.FAMILIES_ENV}
    if families is not None:
        env[registry.FAMILIES_ENV] = families
    done = subprocess.run([sys.executable, "-c", script, str(ROOT / "benchmarks")], capture_output=True,
                          text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.splitlines()


def test_the_asv_suite_benchmarks_a_registered_family_with_no_code_of_its_own(throwaway):
    found = discover(f"{throwaway}:FAMILY")
    mine = {line.split()[0] for line in found if line.startswith("bench_plugins.")}
    assert mine == {
        "bench_plugins.ThrowawayTime.time_call", "bench_plugins.ThrowawayTime.peakmem_call",
        "bench_plugins.ThrowawaySpeedup.track_speedup", "bench_plugins.ThrowawaySyncHazards.track_sync_hazards",
        "bench_plugins.ThrowawayCompile.track_compile_seconds", "bench_plugins.ThrowawayCompile.track_graph_breaks",
        "bench_plugins.ThrowawayCuda.track_cuda_syncs", "bench_plugins.ThrowawayCuda.track_cuda_peak_memory",
        "bench_plugins.ThrowawayNvml.track_gpu_busy", "bench_plugins.ThrowawayNvml.track_gpu_memory",
        "bench_plugins.ThrowawayNvml.track_gpu_power",
    }
    time_line = next(line for line in found if line.startswith("bench_plugins.ThrowawayTime.time_call"))
    assert "['variant', 'n', 'device', 'mode']" in time_line
    assert not any(line.startswith("bench_plugins.") for line in discover(None))

"""examples/item_loop: a user's package that registers a family through the entry point, installed for real."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from asv import util as asv_util

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "item_loop"
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The example installed with pip into its own folder (the suite's venv stays as it is)."""
    target = tmp_path_factory.mktemp("site")
    build = tmp_path_factory.mktemp("build")
    # The source is copied so that the build leaves nothing (build/, *.egg-info) in the checkout.
    subprocess.run(["cp", "-r", str(EXAMPLE), str(build)], check=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--disable-pip-version-check", "--target", str(target), str(build / EXAMPLE.name)],
        check=True, capture_output=True, text=True,
    )
    assert list(target.glob("pitfalls_item_loop-*.dist-info/entry_points.txt"))
    return target


def env_with(site: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PITFALLS_FAMILIES"}
    # asv drops PYTHONPATH in the environments it runs (for isolation) unless ASV_PYTHONPATH says otherwise.
    env.update(PYTHONPATH=str(site), ASV_PYTHONPATH=str(site), PITFALLS_GRID="quick")
    return env


def test_the_installed_entry_point_adds_the_family_to_list_and_check(installed):
    env = env_with(installed)
    listed = subprocess.run([str(BIN / "pitfalls"), "list"], env=env, capture_output=True, text=True, check=True)
    assert "item_loop" in listed.stdout and "loop, tensor" in listed.stdout
    checked = subprocess.run([str(BIN / "pitfalls"), "check", "--device", "cpu"], env=env, capture_output=True,
                             text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    rows = {line.split("│")[2].strip(): line for line in checked.stdout.splitlines() if "item_loop" in line}
    assert set(rows) == {"loop", "tensor"}
    # The loop makes one .item() per element: 100 at the smoke size; the reduction makes none.
    assert rows["loop"].split("│")[6].strip() == "100" and rows["tensor"].split("│")[6].strip() == "0"


def test_without_the_package_the_family_is_not_there():
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PITFALLS_FAMILIES")}
    listed = subprocess.run([str(BIN / "pitfalls"), "list"], env=env, capture_output=True, text=True, check=True)
    assert "item_loop" not in listed.stdout


@pytest.mark.slow
def test_a_one_case_asv_run_of_the_users_family(installed, tmp_path):
    conf = asv_util.load_json(str(ROOT / "asv.conf.json"), js_comments=True)
    for key in ("repo", "benchmark_dir", "env_dir", "html_dir"):
        conf[key] = str(ROOT / conf[key])
    conf["results_dir"] = str(tmp_path / "results")
    (tmp_path / "asv.conf.json").write_text(json.dumps(conf), encoding="utf-8")
    env = {**env_with(installed), "HOME": str(tmp_path)}
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
    asv = str(BIN / "asv")
    subprocess.run([asv, "machine", "--yes", "--machine", "example"], cwd=tmp_path, env=env, check=True,
                   capture_output=True)
    done = subprocess.run(
        [asv, "run", "--config", str(tmp_path / "asv.conf.json"), "-E", "existing:same", "--quick",
         "--show-stderr", "--set-commit-hash", head.stdout.strip(), "--machine", "example",
         "-b", r"^bench_plugins\.ItemLoopSyncHazards\.track_sync_hazards\('loop', 1000, 'cpu'\)$"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    [result] = [p for p in (tmp_path / "results" / "example").glob("*.json") if p.name != "machine.json"]
    values, params = json.loads(result.read_text())["results"][
        "bench_plugins.ItemLoopSyncHazards.track_sync_hazards"][:2]
    measured = dict(zip([", ".join(c) for c in itertools.product(*params)], values, strict=True))
    assert measured.pop("'loop', 1000, 'cpu'") == 1000  # one .item() per element
    # asv stores the cases -b did not select as NaN: not run, so no figure.
    assert all(value != value for value in measured.values()), measured

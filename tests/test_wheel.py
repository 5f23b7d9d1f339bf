"""The package as a user installs it: built into a wheel, installed (not editable) into a virtual environment that
reuses the installed dependencies, and run from a folder outside the checkout."""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.cuda_build  # also in the test command's CUDA-build leg


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("wheel")
    wheels, venv, away = base / "wheels", base / "venv", base / "elsewhere"
    away.mkdir()
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                            str(wheels), str(ROOT)], capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-3000:]
    [wheel] = wheels.glob("pitfalls-*.whl")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    # The dependencies this interpreter has (torch among them), not the checkout: a path entry, not a site dir, so
    # its editable install of the checkout is not read.
    purelib = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  capture_output=True, text=True, check=True).stdout.strip())
    (purelib / "dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    installed = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q",
                                str(wheel)], capture_output=True, text=True, timeout=600)
    assert installed.returncode == 0, installed.stderr[-3000:]
    return {"python": python, "bin": venv / "bin", "away": away}


def run(installed: dict[str, Path], *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run([str(installed["bin"] / "pitfalls"), *args], cwd=installed["away"], env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_the_installed_package_is_the_wheels_not_the_checkouts(installed: dict[str, Path]) -> None:
    where = subprocess.run([str(installed["python"]), "-c", "import pitfalls, pitfalls_asv; print(pitfalls.__file__)"],
                           cwd=installed["away"], capture_output=True, text=True, check=True).stdout.strip()
    # is_relative_to, not a string prefix: a checkout at /tmp/tc would claim /tmp/tctmp/... as its own.
    assert "site-packages" in where and not Path(where).is_relative_to(ROOT)


def test_check_probe_calibrate_scan_and_scan_loader_work_without_the_checkout(installed: dict[str, Path]) -> None:
    checked = run(installed, "check", "--device", "cpu")
    assert checked.returncode == 0, checked.stdout[-2000:] + checked.stderr[-2000:]
    assert "sampler" in checked.stdout
    probed = run(installed, "probe", "loss", "naive", "--batch", "2", "--image-size", "16", "--rounds", "2")
    assert probed.returncode == 0, probed.stderr[-2000:]
    assert "sync hazards" in probed.stdout.lower()
    calibrated = run(installed, "calibrate", "--device", "cpu", "--json", "--only", "sync hazards: 3 planted .item()")
    assert calibrated.returncode == 0, calibrated.stdout[-2000:] + calibrated.stderr[-2000:]
    [row] = json.loads(calibrated.stdout)
    assert (row["check"], row["measured"], row["verdict"]) == ("sync hazards: 3 planted .item()", 3, "pass")
    scanned = run(installed, "scan", "loss/naive")
    assert scanned.returncode == 0, scanned.stderr[-2000:]
    assert "nonzero" in scanned.stdout
    pipeline = installed["away"] / "pipeline.py"
    pipeline.write_text(textwrap.dedent("""
        import torch
        from torch.utils.data import DataLoader, TensorDataset

        def loader():
            return DataLoader(TensorDataset(torch.arange(64.0).reshape(32, 2)), batch_size=4)
    """))
    loaded = run(installed, "scan-loader", f"{pipeline}:loader", "--workers", "0", "--budget", "20", "--json")
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    report = json.loads(loaded.stdout)
    assert (report["samples_per_batch"], report["bytes_per_batch"]) == (4, 4 * 2 * 4)  # four float32 pairs


@pytest.mark.parametrize(("module", "tool"), [("pitfalls.series_guard", "scripts/series"),
                                              ("pitfalls.gpu_run", "scripts/gpu-run"),
                                              ("pitfalls.suite_description", "pitfalls.suite_description")])
def test_a_tool_that_needs_the_checkout_says_so_in_one_line(installed: dict[str, Path], module: str,
                                                            tool: str) -> None:
    args = ["check"] if module == "pitfalls.series_guard" else ["plan"] if module == "pitfalls.gpu_run" else []
    done = subprocess.run([str(installed["python"]), "-m", module, *args], cwd=installed["away"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and tool in lines[0] and "works in a checkout of the suite" in lines[0], done.stderr

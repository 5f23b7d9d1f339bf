"""No silent skip: a skip not on tests/skips.py's allow-list fails scripts/test, and every reason is printed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from skips import allowed

HERE = Path(__file__).resolve().parent

PLANTED = '''
import pytest

def test_runs():
    assert True

def test_needs_cuda():
    pytest.skip("no CUDA device")

def test_skipped_by_a_regression():
    pytest.skip("batch=32 does not fit in memory here")
'''


def run_planted(tmp_path: Path, strict: bool) -> subprocess.CompletedProcess[str]:
    for name in ("conftest.py", "skips.py"):
        shutil.copy(HERE / name, tmp_path / name)
    (tmp_path / "test_planted.py").write_text(PLANTED)
    env = {k: v for k, v in os.environ.items() if k != "PITFALLS_STRICT_SKIPS"}
    if strict:
        env["PITFALLS_STRICT_SKIPS"] = "1"
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly",
                           "-o", "addopts=", str(tmp_path)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)


def test_an_unexpected_skip_fails_the_strict_run_and_the_reasons_come_grouped(tmp_path):
    done = run_planted(tmp_path, strict=True)
    assert done.returncode == 1, done.stdout
    lines = done.stdout.strip().splitlines()
    assert "allowed (no CUDA device): 1" in lines
    assert "NOT ALLOWED: 1 x batch=32 does not fit in memory here" in lines
    # pytest's closing line stays the last one (CI reads it).
    assert "1 passed, 2 skipped" in lines[-1]


def test_outside_scripts_test_the_groups_print_and_the_status_stays(tmp_path):
    done = run_planted(tmp_path, strict=False)
    assert done.returncode == 0, done.stdout
    assert "NOT ALLOWED: 1 x batch=32 does not fit in memory here" in done.stdout


@pytest.mark.parametrize(("reason", "why"), [
    ("no CUDA device", "no CUDA device"),
    ("data_parallel needs 2 or more CUDA devices (nn.DataParallel); this machine has 0", "fewer than 2 GPUs"),
    ("gpu_decode decodes JPEG with torchvision.io.decode_jpeg(device='cuda'); it needs a CUDA device",
     "no CUDA device"),
    ("rebuilds every vendored file ...; set PITFALLS_REFRESH_TEST=1 to run it",
     "opt-in: the registry rebuild of vendored files"),
    ("no Slurm cluster: its daemons run as root and this user is not",
     "no Slurm cluster (not root, or the host name not on loopback)"),
    ("no Slurm cluster: the host name 'node1' resolves to 10.0.0.5, not to loopback only, so its daemons would "
     "listen beyond this machine", "no Slurm cluster (not root, or the host name not on loopback)"),
    ("the Slurm cluster did not start: no Slurm cluster here", None),
    ("needs the merged site of the test above", None),
    ("no chromium on PATH (scripts/test installs it as root)", None),
    ("batch=256 at 256x256 needs 12.0 GiB; 8.0 GiB free", None),
])
def test_the_allow_list_holds_hardware_and_opt_in_reasons_only(reason, why):
    assert allowed(reason) == why


def test_scripts_test_runs_pytest_with_the_strict_policy():
    script = (HERE.parent / "scripts" / "test").read_text()
    assert "export PITFALLS_STRICT_SKIPS=1" in script
    # pytest, through the shuffled runner, in its two phases (tests/shuffled.py), in the test venv and again in the
    # CUDA-build leg's; the worse status is the command's.
    runs = [line.strip() for line in script.splitlines() if "tests/shuffled.py" in line and "--parallel" in line]
    assert [run.split()[0] for run in runs] == ['"${PITFALLS_VENV:-.venv}/bin/python"', '"$leg_venv/bin/python"']
    assert "-m cuda_build" in script.split(runs[1], 1)[1].split("\n")[1]
    assert script.rstrip().splitlines()[-1] == 'exit "$status"'

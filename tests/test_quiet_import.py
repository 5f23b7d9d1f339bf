"""Importing the package queries no CUDA and writes nothing, on every build of torch: asv's forkserver imports the
suite before it forks every benchmark, and each command imports the package before it checks its arguments.

On torch's CUDA build with a CUDA toolkit found (``nvcc`` on PATH, or ``CUDA_HOME``), importing
``torch.utils.cpp_extension`` (which ``torch.utils.benchmark`` imports) calls ``torch.cuda.is_available()`` and
logs "No CUDA runtime is found" to stderr. On the CPU build it does neither, so these tests bite on the test
command's CUDA-build leg (``-m cuda_build``), where they run again; on the CPU build they hold the messages."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_package_imports import modules

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.cuda_build

# Every call that asks the CUDA runtime something; one function per name (torch._dynamo maps each torch function to
# a rule, and one object standing for two functions with different rules stops its import).
QUERIES = ("is_available", "device_count", "init", "_lazy_init", "current_device", "get_device_name",
           "get_device_properties", "mem_get_info", "synchronize", "set_device")


def toolkit_env(tmp_path: Path) -> dict[str, str]:
    """This process's environment with a CUDA toolkit found: the real one where nvcc is on PATH, else a folder."""
    env = dict(os.environ)
    if "CUDA_HOME" not in env and "CUDA_PATH" not in env:
        toolkit = tmp_path / "cuda"
        toolkit.mkdir(exist_ok=True)
        env["CUDA_HOME"] = str(toolkit)
    return env


def test_importing_every_module_queries_no_cuda_and_writes_nothing(tmp_path: Path) -> None:
    names = [*modules(), "pitfalls_asv", "pitfalls_asv_main"]
    script = f"""
import importlib, torch
def queried(name):
    def call(*args, **kwargs):
        raise RuntimeError(f"CUDA was queried ({{name}}) while importing the package")
    return call
for name in {QUERIES!r}:
    setattr(torch.cuda, name, queried(name))
for module in {names!r}:
    importlib.import_module(module)
print(len({names!r}), "modules")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env=toolkit_env(tmp_path), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr == ""
    assert done.stdout.split()[0] == str(len(names))


# (the command after `python -m`, its bad arguments, what its one line says). The commands that check their
# arguments with argparse print its usage first: the lines that do not start with "usage:" or a space are the rest.
BAD = [
    (("pitfalls.cli", "scan", "bogus/naive"), "no family 'bogus'"),
    (("pitfalls.cli", "scan-loader", "nofile.py:loader"), "nofile.py does not exist"),
    (("pitfalls.cli", "doctor", "/no/such/train.py"), "SCRIPT '/no/such/train.py' does not exist"),
    (("pitfalls.cli", "merge", "no-such-results"), "asv.conf.json: no such file"),
    (("pitfalls.cli", "check", "--device", "tpu"), "invalid choice: 'tpu'"),
    (("pitfalls.cli", "calibrate", "--only", "bogus"), "--only 'bogus' is not a check"),
    (("pitfalls.cli", "probe", "sampler", "static", "--n", "-5"), "n=-5 is not allowed"),
    (("pitfalls.gpu_run", "OUT", "--budget", "soon", "--device", "cpu"), "'soon' is not a number of seconds"),
    (("pitfalls.report.gpu_merge", "no/such/archive.tar.gz"), "no such archive or folder"),
    (("pitfalls.series_guard", "bogus"), "invalid choice: 'bogus'"),
    (("pitfalls.docs", "--bogus"), "unrecognized arguments: --bogus"),
]


@pytest.mark.parametrize(("command", "said"), BAD, ids=[" ".join(c[:2]) for c, _ in BAD])
def test_a_bad_command_line_is_one_line_on_stderr_with_a_toolkit_found(tmp_path: Path, command: tuple[str, ...],
                                                                       said: str) -> None:
    args = [str(tmp_path / "out") if arg == "OUT" else arg for arg in command]
    done = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=300,
                          env=toolkit_env(tmp_path), cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if not line.startswith(("usage:", " "))]
    assert len(lines) == 1 and said in lines[0], done.stderr


def test_a_report_of_nothing_writes_nothing_to_stderr(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "pitfalls.cli", "report", "--results", str(tmp_path / "none"),
                           "--out", str(tmp_path / "report")], capture_output=True, text=True, timeout=300,
                          env=toolkit_env(tmp_path), cwd=tmp_path)
    assert done.returncode == 2 and "is not a folder" in done.stdout
    assert done.stderr == ""

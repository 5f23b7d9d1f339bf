"""A run's processes share its compile crashes: a case whose compile crashed is compiled once per run, and each
later build of it skips with the same reason (`pitfalls.measure.case`, the main job's `PITFALLS_COMPILE_FAILURES`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from pitfalls import measure
from pitfalls.family import SkipCase
from pitfalls.grids import COMPILE_FAILURES_ENV

# A process of its own, as asv's forked benchmark processes are: it builds one compiled case and says what it got.
BUILD = """
import json, sys
import torch
from pitfalls import measure
from pitfalls.families import sampler
from pitfalls.family import SkipCase
compiles = []
def crash(fn):
    def compiled(*args, **kwargs):
        compiles.append(1)
        error = torch._dynamo.exc.BackendCompilerFailed.__new__(torch._dynamo.exc.BackendCompilerFailed)
        Exception.__init__(error, "backend='inductor' raised: RuntimeError: inductor fell over")
        error.backend_name, error.inner_exception = "inductor", RuntimeError("inductor fell over")
        raise error
    return compiled
sampler.torch.compile = crash
try:
    measure.case("sampler", "static", "cpu", sys.argv[1], n=int(sys.argv[2]), batch=1)
    print(json.dumps({"compiles": len(compiles), "skip": None}))
except SkipCase as skip:
    print(json.dumps({"compiles": len(compiles), "skip": skip.reason}))
"""


def build(mode: str, n: int, env: dict[str, str]) -> dict[str, object]:
    done = subprocess.run([sys.executable, "-c", BUILD, mode, str(n)], capture_output=True, text=True, env=env,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.mark.slow
def test_a_crashed_compile_is_compiled_once_per_run_and_skipped_by_the_later_processes_with_its_reason(tmp_path):
    memo = tmp_path / "compile-failures.jsonl"
    env = {**os.environ, COMPILE_FAILURES_ENV: str(memo)}
    first = build("compiled", 100, env)
    assert first["compiles"] == 1 and "inductor fell over" in str(first["skip"])
    assert len(memo.read_text().splitlines()) == 1
    # The same case in a later process: the same reason, nothing compiled.
    assert build("compiled", 100, env) == {"compiles": 0, "skip": first["skip"]}
    # Another size is another case: it is compiled (and crashes) for itself.
    assert build("compiled", 200, env)["compiles"] == 1
    assert len(memo.read_text().splitlines()) == 2
    # The eager program of the crashed case runs, and without the file every process compiles for itself.
    assert build("eager", 100, env) == {"compiles": 0, "skip": None}
    alone = {name: value for name, value in env.items() if name != COMPILE_FAILURES_ENV}
    assert build("compiled", 100, alone)["compiles"] == 1


def test_a_crash_recorded_under_another_torch_or_device_is_not_read(tmp_path, monkeypatch):
    # The file's key holds torch's version, the family, variant, device, mode and sizes: only the same case skips.
    memo = tmp_path / "compile-failures.jsonl"
    monkeypatch.setenv(COMPILE_FAILURES_ENV, str(memo))
    other = json.dumps(["0.0.0", "sampler", "static", "cpu", "compiled", [["batch", 1], ["n", 100]]])
    memo.write_text(json.dumps({"case": other, "reason": "recorded under another torch"}) + "\n")
    assert measure.case("sampler", "static", "cpu", "compiled", n=100, batch=1).compiled
    same = json.dumps([torch.__version__, "sampler", "static", "cpu", "compiled", [["batch", 1], ["n", 104]]])
    memo.write_text(json.dumps({"case": same, "reason": "recorded here"}) + "\n")
    with pytest.raises(SkipCase, match="^recorded here$"):
        measure.case("sampler", "static", "cpu", "compiled", n=104, batch=1)

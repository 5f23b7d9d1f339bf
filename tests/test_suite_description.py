"""results/benchmarks.json describes the suite of this checkout, as asv's discovery writes it."""

from __future__ import annotations

import subprocess
import sys

from pitfalls import suite_description


def test_the_committed_suite_description_is_what_asv_writes_from_this_checkout():
    done = subprocess.run([sys.executable, "-m", "pitfalls.suite_description"], capture_output=True, text=True,
                          timeout=900)
    # On a difference the output names each benchmark and field, and ends with the command that refreshes it.
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_differences_name_each_benchmark_and_field():
    old = {"a.B.time_x": {"version": "1", "code": "c"}, "a.B.time_gone": {"version": "1"}}
    new = {"a.B.time_x": {"version": "2", "code": "c"}, "a.B.time_new": {"version": "1"}}
    assert suite_description.differences(old, new) == [
        "a.B.time_gone: not in the suite any more",
        "a.B.time_new: not in the committed description",
        "a.B.time_x: version differ",
    ]
    assert suite_description.differences(new, new) == []


def test_the_discovery_is_the_whole_suite_with_asvs_fields():
    found = suite_description.discovered()
    assert {name.split(".")[0] for name in found} >= {"bench_loss", "bench_sampler", "bench_loader", "bench_parallel"}
    loss = found["bench_loss.Compile.track_compile_seconds"]
    assert {"name", "version", "code", "params", "param_names", "type", "unit"} <= set(loss)
    # The pinned version (benchmarks/series.json) is what asv records.
    from pitfalls.series_guard import load_pins

    assert loss["version"] == load_pins()["bench_loss.Compile.track_compile_seconds"].version

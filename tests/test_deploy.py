"""The fleet: Kubernetes manifests (validated against the API schema) and the Slurm scripts."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
KUBERNETES = ROOT / "deploy" / "kubernetes"
SLURM = ROOT / "deploy" / "slurm"
MANIFESTS = sorted(KUBERNETES.glob("*.yaml"))
VALIDATE = shutil.which("kubernetes-validate", path=str(Path(sys.executable).parent)) or shutil.which(
    "kubernetes-validate"
)
GPU_PRODUCT = "nvidia.com/gpu.product"

needs_validate = pytest.mark.skipif(
    VALIDATE is None, reason="kubernetes-validate not installed (the test extra of pyproject.toml has it)"
)


def validate(*paths: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(VALIDATE), "--strict", "--quiet", *map(str, paths)], capture_output=True, text=True)


def manifest(name: str) -> dict:
    return yaml.safe_load((KUBERNETES / name).read_text())


@needs_validate
def test_the_manifests_match_the_kubernetes_api():
    assert {path.name for path in MANIFESTS} == {"fleet-job.yaml", "merge-job.yaml", "results-volume.yaml"}
    done = validate(*MANIFESTS)
    assert done.returncode == 0, done.stdout + done.stderr


@needs_validate
def test_validation_refuses_a_misspelt_field(tmp_path):
    bad = tmp_path / "job.yaml"
    bad.write_text((KUBERNETES / "fleet-job.yaml").read_text().replace("subPathExpr:", "subPathExpresion:"))
    done = validate(bad)
    assert done.returncode != 0 and "subPathExpresion" in done.stdout + done.stderr


def test_the_fleet_is_one_pod_per_gpu_kind_with_one_gpu_each():
    job = manifest("fleet-job.yaml")
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    assert spec["completionMode"] == "Indexed"
    (term,) = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    (kinds,) = [e for e in term["matchExpressions"] if e["key"] == GPU_PRODUCT and e["operator"] == "In"]
    assert spec["completions"] == spec["parallelism"] == len(kinds["values"]) == len(set(kinds["values"]))
    # No two pods of the job on one GPU kind.
    (apart,) = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert apart["topologyKey"] == GPU_PRODUCT
    assert apart["labelSelector"]["matchLabels"].items() <= job["spec"]["template"]["metadata"]["labels"].items()
    (suite,) = pod["containers"]
    assert suite["resources"]["requests"]["nvidia.com/gpu"] == suite["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert {"name": "PITFALLS_GRID", "value": "full"} in suite["env"]


def test_each_pod_writes_its_own_results_folder_as_a_non_root_user():
    job = manifest("fleet-job.yaml")
    pod = job["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    (suite,) = pod["containers"]
    (mount,) = suite["volumeMounts"]
    assert mount["mountPath"] == "/suite/results" and mount["subPathExpr"] == "results-$(INDEX)"
    index = {e["name"]: e for e in suite["env"]}["INDEX"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert index == "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    # The init container makes that folder as the suite's uid, not kubelet as root.
    (init,) = pod["initContainers"]
    assert 'mkdir -p "/fleet/results-$INDEX"' in " ".join(init["command"])
    claim = manifest("results-volume.yaml")
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    for name in ("fleet-job.yaml", "merge-job.yaml"):
        (volume,) = manifest(name)["spec"]["template"]["spec"]["volumes"]
        assert volume["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]


def test_the_merge_job_merges_every_pods_folder_into_one_site():
    fleet, merge = manifest("fleet-job.yaml"), manifest("merge-job.yaml")
    (suite,) = fleet["spec"]["template"]["spec"]["containers"]
    (merger,) = merge["spec"]["template"]["spec"]["containers"]
    assert merger["image"] == suite["image"]
    assert "nvidia.com/gpu" not in merger["resources"]["requests"]
    command = " ".join(merger["command"] + merger["args"])
    assert "pitfalls merge /fleet/results-* --out /fleet/results --html /fleet/html" in command


# --- Slurm ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["pitfalls-array.sbatch", "submit-fleet"])
def test_the_slurm_scripts_parse(name):
    done = subprocess.run(["bash", "-n", str(SLURM / name)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_array_script_runs_the_image_with_a_gpu_into_its_own_results_folder():
    text = (SLURM / "pitfalls-array.sbatch").read_text()
    assert "#SBATCH --gres=gpu:1" in text
    assert 'results="$fleet/results-$task"' in text
    assert "apptainer run --nv" in text and '--bind "$results:/suite/results"' in text


def test_submit_fleet_submits_one_task_per_gpu_kind_then_the_merge(tmp_path):
    """submit-fleet against a stand-in sbatch that records its arguments and answers job ids."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "sbatch.log"
    fake = bin_dir / "sbatch"
    fake.write_text(
        "#!/bin/bash\n"
        f'printf "%s\\n" "$*" >>"{log}"\n'
        f'echo $((100 + $(wc -l <"{log}")))\n'
    )
    fake.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", PITFALLS_FLEET=str(tmp_path / "fleet"))
    done = subprocess.run(
        ["bash", str(SLURM / "submit-fleet"), "gpu:h100:1", "gpu:l4:1"], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr
    first, second, merge = log.read_text().splitlines()
    assert "--array=0 --gres=gpu:h100:1" in first and first.endswith("pitfalls-array.sbatch")
    assert "--array=1 --gres=gpu:l4:1" in second
    assert "--dependency=afterok:101:102" in merge
    assert f"pitfalls merge '{tmp_path / 'fleet'}'/results-*" in merge


def test_submit_fleet_without_gpu_kinds_says_how_to_call_it():
    done = subprocess.run(["bash", str(SLURM / "submit-fleet")], capture_output=True, text=True)
    assert done.returncode == 2 and "usage:" in done.stderr and len(done.stderr.splitlines()) == 1

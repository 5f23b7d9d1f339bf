"""The fleet: Kubernetes manifests (validated against the API schema) and the Slurm scripts (their arguments, with a
stand-in sbatch; tests/test_slurm_fleet.py runs them on a real cluster)."""

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
    # Without a container: the checkout's own run-suite in a clone; a real cluster runs it (test_slurm_fleet.py).
    assert 'runtime=${PITFALLS_RUNTIME:-apptainer}' in text and "bash scripts/run-suite --no-publish" in text


def stand_in_sbatch(tmp_path: Path) -> tuple[Path, Path]:
    """A folder holding an ``sbatch`` that records its arguments (and PITFALLS_COMMIT) and answers job ids."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "sbatch.log"
    fake = bin_dir / "sbatch"
    fake.write_text(
        "#!/bin/bash\n"
        f'printf "%s commit=%s\\n" "$*" "${{PITFALLS_COMMIT:-}}" >>"{log}"\n'
        f'echo "$((100 + $(wc -l <"{log}")));cluster"\n'
    )
    fake.chmod(0o755)
    return bin_dir, log


def submit_fleet(tmp_path: Path, *args: str, **env: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """submit-fleet against the stand-in sbatch: its result and the sbatch calls it made, one line each."""
    bin_dir, log = stand_in_sbatch(tmp_path)
    environ = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PITFALLS_FLEET": str(tmp_path / "fleet"),
               **env}
    done = subprocess.run(["bash", str(SLURM / "submit-fleet"), *args], capture_output=True, text=True, env=environ,
                          cwd=tmp_path)
    return done, (log.read_text().splitlines() if log.exists() else [])


def test_submit_fleet_submits_one_task_per_gpu_kind_then_the_merge(tmp_path):
    """submit-fleet against a stand-in sbatch that records its arguments and answers job ids."""
    done, calls = submit_fleet(tmp_path, "gpu:h100:1", "gpu:l4:1")
    assert done.returncode == 0, done.stderr
    first, second, merge = calls
    assert "--array=0 --gres=gpu:h100:1" in first and first.split()[-2].endswith("pitfalls-array.sbatch")
    assert "--array=1 --gres=gpu:l4:1" in second
    assert f"--output={tmp_path / 'fleet' / 'logs'}/pitfalls-%A_%a.out" in first
    # The merge waits for both, is cancelled if one fails, asks for no GPU, and runs the script's merge.
    assert "--dependency=afterok:101:102 --kill-on-invalid-dep=yes --gres=none" in merge
    assert "pitfalls-array.sbatch --merge" in merge
    # The ids on stdout, one a line, the merge's last (without sbatch's ";cluster").
    assert done.stdout.split() == ["101", "102", "103"]
    assert (tmp_path / "fleet" / "logs").is_dir()


def test_submit_fleet_takes_kinds_by_partition_or_feature_and_options_for_every_job(tmp_path):
    done, calls = submit_fleet(tmp_path, "--mem=1G", "partition=a100", "--time=30", "constraint=l4", "gres=gpu:2",
                               "--", "-b", "bench_loss")
    assert done.returncode == 0, done.stderr
    first, second, third, merge = calls
    assert "--array=0 --partition=a100 --mem=1G --time=30 " in first
    assert "--array=1 --constraint=l4 --mem=1G --time=30 " in second
    assert "--array=2 --gres=gpu:2 --mem=1G --time=30 " in third
    # run-suite's arguments go to the tasks, not to the merge; the options go to every job, after the merge's own.
    assert all(call.endswith("pitfalls-array.sbatch -b bench_loss commit=") for call in (first, second, third))
    assert "--mem=4G --time=1:00:00 --mem=1G --time=30 " in merge and "bench_loss" not in merge


def test_submit_fleet_without_a_container_runs_the_checkouts_head(tmp_path):
    done, calls = submit_fleet(tmp_path, "partition=a100", PITFALLS_RUNTIME="checkout")
    assert done.returncode == 0, done.stderr
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    assert all(call.endswith(f"commit={head}") for call in calls), calls


@pytest.mark.parametrize(("args", "env", "said"), [
    ((), {}, "usage:"),
    (("--mem=1G",), {}, "usage:"),
    (("node=a100",), {}, "error: KIND node=a100 is not a kind; allowed: gres=SPEC (or a bare SPEC), partition=NAME"),
    (("gpu:1",), {"PITFALLS_RUNTIME": "docker"},
     "error: PITFALLS_RUNTIME=docker is not a runtime; allowed: apptainer, checkout"),
])
def test_submit_fleet_refuses_bad_input_in_one_line_before_submitting_anything(tmp_path, args, env, said):
    done, calls = submit_fleet(tmp_path, *args, **env)
    assert done.returncode == 2 and done.stderr.startswith(said) and len(done.stderr.splitlines()) == 1
    assert calls == []


def array_task(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Task 0 of the array script run by hand, as Slurm would, with its scratch folders under ``tmp_path``."""
    environ = {**os.environ, "SLURM_ARRAY_TASK_ID": "0", "PITFALLS_FLEET": str(tmp_path / "fleet"),
               "TMPDIR": str(tmp_path), **env}
    return subprocess.run(["bash", str(SLURM / "pitfalls-array.sbatch")], capture_output=True, text=True,
                          env=environ, cwd=tmp_path, timeout=120)


def test_the_array_script_refuses_an_unknown_runtime_in_one_line(tmp_path):
    done = array_task(tmp_path, PITFALLS_RUNTIME="docker")
    assert done.returncode == 2 and done.stderr.splitlines() == [
        "error: PITFALLS_RUNTIME=docker is not a runtime; allowed: apptainer, checkout"]
    assert list(tmp_path.iterdir()) == []


def test_a_task_refuses_a_shared_venv_made_from_another_pyproject(tmp_path):
    """Bootstrapping a venv every task shares from one task's clone would break it for the others: refused."""
    other = tmp_path / "venv"
    (other / "bin").mkdir(parents=True)
    # Not an interpreter: whatever would install into it fails instead of reaching a real Python.
    (other / "bin" / "python").write_text("#!/bin/sh\necho 'the venv was used' >&2\nexit 97\n")
    (other / "bin" / "python").chmod(0o755)
    (other / ".pitfalls-installed").write_text("0123456789abcdef torch==2.13.0\n")
    done = array_task(tmp_path, PITFALLS_RUNTIME="checkout", PITFALLS_REPO=str(ROOT), PITFALLS_VENV=str(other))
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        f"error: {other} was not made by this scripts/bootstrap from this pyproject.toml with "
        f"PITFALLS_TORCH=torch==2.13.0 and the extras test,bench; make it with: PITFALLS_VENV={other} bash "
        "scripts/bootstrap"]
    # Nothing installed into it, nothing measured, the job's scratch folder removed.
    assert sorted(p.name for p in other.iterdir()) == [".pitfalls-installed", "bin"]
    assert not list((tmp_path / "fleet" / "results-0").iterdir()) and not list(tmp_path.glob("pitfalls-job.*"))


def test_a_commit_whose_bootstrap_cannot_check_is_not_run_with_a_shared_venv(tmp_path):
    """Before scripts/bootstrap had --check, it would have read the flag as nothing and reinstalled the venv."""
    added = subprocess.run(["git", "-C", str(ROOT), "log", "--format=%H", "-S--check", "--", "scripts/bootstrap"],
                           capture_output=True, text=True, check=True).stdout.split()[-1]
    before = subprocess.run(["git", "-C", str(ROOT), "rev-parse", f"{added}^"], capture_output=True, text=True,
                            check=True).stdout.strip()
    done = array_task(tmp_path, PITFALLS_RUNTIME="checkout", PITFALLS_REPO=str(ROOT), PITFALLS_COMMIT=before,
                      PITFALLS_VENV=str(tmp_path / "venv"))
    assert done.returncode == 2 and done.stderr.splitlines() == [
        f"error: scripts/bootstrap of {before} cannot check a shared venv without reinstalling it; run that commit "
        "without PITFALLS_VENV"]
    assert not (tmp_path / "venv").exists() and not list(tmp_path.glob("pitfalls-job.*"))

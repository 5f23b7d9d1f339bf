"""The facts that make a measurement reproducible: software versions, hardware, container, suite commit.

Every value is JSON-serialisable. A fact that cannot be known here is the string "unavailable: <reason>"
(`str(Unavailable(...))`), never None or 0, so that a results file says why it is missing.
"""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from pitfalls import processes
from pitfalls.probes._cuda import cuda_unavailable_reason
from pitfalls.probes.nvml import nvml_query
from pitfalls.result import Unavailable

__all__ = ["environment"]

_GIB = 1024**3


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass  # not Linux: fall through to what platform knows
    return platform.processor() or str(Unavailable("CPU model not reported by this OS"))


def _usable_cpus() -> int | str:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return str(Unavailable("CPU affinity not reported by this OS"))


def _git(checkout: Path, *args: str) -> str | Unavailable:
    try:
        done = processes.run(["git", "-C", str(checkout), *args], timeout_s=10, capture_output=True, text=True)
    except FileNotFoundError:
        return Unavailable("git not installed")
    except subprocess.TimeoutExpired:
        return Unavailable("git timed out")
    if done.returncode != 0:
        return Unavailable(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "git failed")
    return done.stdout.strip()


def _commit(checkout: Path, environ: Mapping[str, str]) -> dict[str, Any]:
    head = _git(checkout, "rev-parse", "HEAD")
    if isinstance(head, str):
        status = _git(checkout, "status", "--porcelain", "--untracked-files=no")
        dirty: bool | str = bool(status) if isinstance(status, str) else str(status)
        return {"commit": head, "commit_source": "git", "commit_dirty": dirty}
    if environ.get("PITFALLS_COMMIT"):
        return {"commit": environ["PITFALLS_COMMIT"], "commit_source": "PITFALLS_COMMIT",
                "commit_dirty": str(Unavailable("not a git checkout"))}
    missing = str(Unavailable(f"no git checkout ({head.reason}) and PITFALLS_COMMIT not set"))
    return dict.fromkeys(("commit", "commit_source", "commit_dirty"), missing)


def _driver(nvml: Any) -> str:
    version = nvml_query(lambda n: n.nvmlSystemGetDriverVersion(), nvml)
    if isinstance(version, Unavailable):
        return str(version)
    return version.decode() if isinstance(version, bytes) else str(version)


def _gpus() -> list[dict[str, Any]] | str:
    reason = cuda_unavailable_reason()
    if reason is not None:
        return str(Unavailable(reason))
    gpus = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        gpus.append({
            "index": index,
            "name": props.name,
            "memory_gib": round(props.total_memory / _GIB, 2),
            "capability": f"{props.major}.{props.minor}",
            "multiprocessors": props.multi_processor_count,
        })
    return gpus


def environment(
    *,
    nvml: Any = None,
    environ: Mapping[str, str] | None = None,
    checkout: Path | str | None = None,
) -> dict[str, Any]:
    """Collect the facts to store next to every result.

    Args:
        nvml: the NVML binding for the driver version; None imports pynvml. Tests pass a fake.
        environ: where to read PITFALLS_IMAGE and PITFALLS_COMMIT; None means os.environ.
        checkout: a folder inside the suite's git checkout; None means this package's folder.

    Returns:
        A JSON-serialisable dict; facts that cannot be known here are "unavailable: <reason>" strings.
    """
    env = os.environ if environ is None else environ
    where = Path(checkout) if checkout is not None else Path(__file__).resolve().parent
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    facts: dict[str, Any] = {
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "executable": sys.executable,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "hostname": socket.gethostname(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count() or str(Unavailable("os.cpu_count() could not tell")),
        "cpu_usable": _usable_cpus(),
        "torch": torch.__version__,
        "torch_git": torch.version.git_version,
        "torch_num_threads": torch.get_num_threads(),
        "cuda": torch.version.cuda or str(Unavailable("torch built without CUDA")),
        "cudnn": cudnn if cudnn is not None else str(Unavailable("cuDNN not available in this torch build")),
        "driver": _driver(nvml),
        "gpus": _gpus(),
        "container_image": env.get("PITFALLS_IMAGE") or str(Unavailable("PITFALLS_IMAGE not set")),
        "in_container": os.path.exists("/.dockerenv") or os.path.exists("/run/.containerenv"),
    }
    facts.update(_commit(where, env))
    return facts

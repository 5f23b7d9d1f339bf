"""The machine a run is recorded under: one name rule and every fact, on a fresh machine or not.

asv copies the machine's facts from ``~/.asv-machine.json`` into every result's params (the site's facets and
series), and on a fresh machine ``asv machine --yes --machine NAME`` saves only the name there: so the facts are
written in full, through asv's own machine record, before asv runs. Which value wins, and why a committed record
is never rewritten with fewer facts: docs/asv.md ("Running it").
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pitfalls import asv_files, processes
from pitfalls.runner.conf import RunnerError
from pitfalls_asv_main import save_machine

__all__ = ["GPU_FACTS", "MachineRecord", "hardware", "machine_facts", "machine_name", "record_machine"]

GPU_FACTS = ("gpu", "gpu_driver", "cuda")
DIRTY_SUFFIX = "-dirty"

# Run in a throw-away interpreter: it imports torch and may initialize CUDA, which a process that later forks
# benchmarks must never do.
_HARDWARE_PROBE = """
import json
from pitfalls.probes.environment import environment
facts = environment()
print(json.dumps({key: facts[key] for key in ("cpu_model", "cpu_usable", "gpus", "driver", "cuda", "torch")}))
"""


def hardware(python: str | None = None, device: str | None = None) -> dict[str, Any]:
    """CPU model and usable CPUs, GPUs, driver and CUDA version, as the interpreter ``python`` sees them.

    Args:
        python: the interpreter that will run the benchmarks (default: this one).
        device: "cpu" for a CPU-only run on a machine that may have a GPU: its GPUs are then left out, so the
            machine is named and described by its CPU. None describes everything there is.

    Returns:
        ``pitfalls.probes.environment`` facts: ``cpu_model``, ``cpu_usable``, ``gpus`` (a list, or an
        "unavailable: <reason>" string), ``driver``, ``cuda``, ``torch``.
    """
    done = processes.run([python or sys.executable, "-c", _HARDWARE_PROBE], timeout_s=300, capture_output=True,
                         text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RunnerError(f"cannot read this machine's hardware with {python or sys.executable}: {last}")
    facts = dict(json.loads(done.stdout.strip().splitlines()[-1]))
    if device == "cpu":
        facts["gpus"] = "unavailable: a CPU-only run"
    return facts


def _gpus(facts: Mapping[str, Any]) -> list[dict[str, Any]]:
    gpus = facts.get("gpus")
    return list(gpus) if isinstance(gpus, list) else []


def machine_name(facts: Mapping[str, Any]) -> str:
    """A results folder name that says what measured: ``gpu-nvidia-h200``, else ``cpu-amd-epyc-2cpu``.

    Args:
        facts: :func:`hardware`'s facts.
    """
    gpus = _gpus(facts)
    label = f"gpu {gpus[0]['name']}" if gpus else f"cpu {facts.get('cpu_model', 'cpu')} {facts.get('cpu_usable')}cpu"
    label = re.sub(r"\((r|tm)\)", "", label.lower())
    return re.sub(r"[^a-z0-9]+", "-", label).strip("-")


IMAGE_ENV = "PITFALLS_IMAGE"


def machine_facts(name: str, facts: Mapping[str, Any]) -> dict[str, str]:
    """asv's machine fields as asv measures them, under ``name``, plus the GPU, its driver and CUDA version.

    asv's machine record has no GPU field; extra keys travel like its own (into machine.json and every
    result's params), so a GPU machine's results carry them as facets. A machine without a GPU gets none of
    these keys rather than a placeholder, so its results keep the params of earlier CPU results.
    """
    from asv.machine import Machine

    record: dict[str, str] = {key: str(value) for key, value in Machine.get_defaults().items()}
    record["machine"] = name
    gpus = _gpus(facts)
    if gpus:
        record["gpu"] = ", ".join(dict.fromkeys(str(gpu["name"]) for gpu in gpus))
        record["gpu_driver"] = str(facts.get("driver"))
        record["cuda"] = str(facts.get("cuda"))
    # The container image a run measured in (the Dockerfile sets it to its base image): two images on one
    # machine are then two series of the site's "image" facet, not one overwriting the other.
    image = os.environ.get(IMAGE_ENV)
    if image:
        record["image"] = image
    return record


@dataclass(frozen=True)
class MachineRecord:
    """The facts a run is recorded under.

    Attributes:
        name: the machine name (results/<name>/).
        facts: every fact, as written to asv's machine record.
        kept: ``(fact, recorded value, measured value)`` for each recorded value that differs from the measurement.
    """

    name: str
    facts: dict[str, str]
    kept: tuple[tuple[str, str, str], ...] = field(default=())
    recorded_in: str = ""

    def describe_kept(self) -> list[str]:
        """One line per kept value, for the log."""
        return [f"machine {self.name}: keeping the recorded {key} {old!r} (measured now: {new!r}); delete "
                f"{self.recorded_in} to record the machine anew" for key, old, new in self.kept]


def _filled(entry: Mapping[str, Any]) -> dict[str, str]:
    """A machine record's facts that hold a value, as strings."""
    return {key: str(value) for key, value in entry.items() if value not in (None, "")}


def _recorded(path: Path) -> dict[str, str]:
    if not path.is_file():
        return {}
    try:
        return _filled(asv_files.read_json(path, asv_files.MACHINE_API))
    except asv_files.Unreadable as error:
        raise RunnerError(f"{path}: not an asv machine record: {error.reason}") from error


def _users_entry(name: str, machine_file: Path | None) -> dict[str, str]:
    from asv import util
    from asv.machine import MachineCollection

    try:
        return _filled(MachineCollection.load(name, _path=None if machine_file is None else str(machine_file)))
    except util.UserError:
        return {}


def record_machine(name: str, results_dir: str | os.PathLike[str], facts: Mapping[str, Any], *,
                   base_name: str | None = None, machine_file: str | os.PathLike[str] | None = None) -> MachineRecord:
    """Write the machine's full facts to asv's machine record (``~/.asv-machine.json``), where ``asv run`` reads them.

    Args:
        name: the machine name to record under.
        results_dir: the results folder whose ``<machine>/machine.json`` holds the recorded facts.
        facts: :func:`hardware`'s facts.
        base_name: take the recorded facts of this machine instead (a dirty run's machine is the clean one's
            name plus a suffix, with the same facts).
        machine_file: asv's machine file (default ``~/.asv-machine.json``).

    Returns:
        What was written, with the recorded values kept over the measured ones.
    """
    folder = Path(results_dir)
    measured = machine_facts(name, facts)
    path = None if machine_file is None else Path(machine_file)
    record_file = folder / name / "machine.json"
    if not record_file.is_file():
        record_file = folder / (base_name or name) / "machine.json"
    recorded = _recorded(record_file)
    merged = {**_users_entry(name, path), **measured, **recorded, "machine": name}
    kept = tuple((key, merged[key], measured[key]) for key in sorted(measured)
                 if key != "machine" and merged[key] != measured[key])
    save_machine(name, merged, path)
    return MachineRecord(name=name, facts=merged, kept=kept, recorded_in=str(record_file))

"""How the suite drives asv: one staged configuration, one machine record, results merged under a lock.

``scripts/run-suite``, ``scripts/run-history``, ``scripts/compare`` and the budgeted GPU run's asv slices all run
asv through this package (``python -m pitfalls.runner suite|history|compare``; one staged run, `runner.staged`);
``pitfalls merge`` brings several machines' results together. The asv environment plugin it selects
(``installed``) lives in the top-level module ``pitfalls_asv``, so that asv can load it without importing torch.
"""

from pitfalls.runner.conf import RunnerError, load_conf, project_paths, write_staged_conf
from pitfalls.runner.machine import MachineRecord, hardware, machine_facts, machine_name, record_machine
from pitfalls.runner.merge import merge_folders
from pitfalls.runner.store import locked, merge_into, snapshot, suite_conflicts

__all__ = [
    "MachineRecord",
    "RunnerError",
    "hardware",
    "load_conf",
    "locked",
    "machine_facts",
    "machine_name",
    "merge_folders",
    "merge_into",
    "project_paths",
    "record_machine",
    "snapshot",
    "suite_conflicts",
    "write_staged_conf",
]

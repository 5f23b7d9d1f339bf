"""A closed loader leaves nothing behind: no named semaphore, no shared-memory segment, no resource tracker warning.

A spawn-context DataLoader's queues hold named semaphores that multiprocessing's resource tracker watches; torch's
shutdown leaves the threads that feed its index queues running, and with them two of those semaphores. The cases run
in a fresh interpreter whose feeder threads end late, as on a loaded machine, and whose tracker is stopped right after
the spawn case is closed, as tests/conftest.py stops it after the test that started it: a semaphore still held then is
unlinked twice (the tracker's "leaked semaphore objects" warning, then `sem_unlink`'s FileNotFoundError or, from a
tracker started afresh, `KeyError: '/mp-...'`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from pitfalls.families.loader.data import CACHE_ENV

pytestmark = pytest.mark.slow

SHM = Path("/dev/shm")

CASES = textwrap.dedent("""
    import json, os, sys, time
    from multiprocessing import process, queues, resource_tracker

    import torch

    from pitfalls import registry
    from pitfalls.families import loader
    from pitfalls.families.loader import probes

    prefix, late_s = sys.argv[1], float(sys.argv[2])
    # Every named semaphore of this process is named after the test's prefix: what it leaves in /dev/shm is its own.
    process.current_process()._config["semprefix"] = "/" + prefix
    feed = queues.Queue._feed

    def late(*args):
        try:
            return feed(*args)
        finally:
            time.sleep(late_s)

    queues.Queue._feed = staticmethod(late)

    def held():
        return sorted(name for name in os.listdir("/dev/shm") if name.startswith("sem." + prefix))

    params = registry.family("loader").resolve({"image_size": 32, "batch": 4, "items": 8, "num_workers": 1,
                                                "start_method": "spawn", "storage": "packed"})
    pids = [os.getpid()]
    with loader.make_step("ram_encoded", torch.device("cpu"), params) as step:
        step.inputs()
        made = held()
        pids += step.worker_pids()
    after_close = held()
    resource_tracker._resource_tracker._stop()
    # The in-flight probe's case, with forked workers (batches in torch's shared memory).
    flight = probes.in_flight("naive", "cpu", num_workers=2, image_size=32, batch=8, items=16, prefetch_factor=3)
    print(json.dumps({"pids": pids, "made": made, "after_close": after_close, "batches": flight.batches}))
""")


def test_a_closed_loader_holds_no_semaphore_and_leaves_nothing_in_dev_shm(tmp_path: Path) -> None:
    prefix = f"pitfalls-test-{uuid.uuid4().hex[:12]}"
    done = subprocess.run([sys.executable, "-c", CASES, prefix, "1.0"], capture_output=True, text=True, timeout=600,
                          env={**os.environ, CACHE_ENV: str(tmp_path / "data")}, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.splitlines()[-1])
    assert len(found["made"]) >= 2 and found["batches"] == 6  # the spawn case made named semaphores; the probe ran
    assert found["after_close"] == [], "a closed loader still holds named semaphores (a feeder thread still runs)"
    for said in ("Traceback", "resource_tracker", "leaked", "sem_unlink"):
        assert said not in done.stderr, done.stderr[-3000:]
    left = [name for name in os.listdir(SHM)
            if name.startswith(f"sem.{prefix}") or any(name.startswith(f"torch_{pid}_") for pid in found["pids"])]
    assert left == []

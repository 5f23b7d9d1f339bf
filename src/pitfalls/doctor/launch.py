"""`pitfalls doctor --nproc-per-node N SCRIPT -- ARGS`: the doctor in N ranks, started by torch's own launcher in this
process, its stores and the ranks' gloo sockets on loopback only (docs/doctor.md, "Under torchrun: every rank, one
report").
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

from pitfalls.distributed.control import loopback_stores

__all__ = ["launch"]

# The launcher's own log (its banner, a failed rank's summary), kept quiet: the report says how each rank ended.
_LOGGERS = ("torch.distributed.run", "torch.distributed.elastic")


def launch(nproc: int, doctor_argv: Sequence[str]) -> int:
    """Run the doctor in ``nproc`` ranks through torchrun, in this process; returns rank 0's exit status.

    Args:
        nproc: ranks on this machine.
        doctor_argv: the doctor's own arguments for every rank: options, SCRIPT, ``--`` and the script's arguments.
    """
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main

    # OMP_NUM_THREADS: torchrun's own default, given here so that it does not print a banner about it.
    environ = {"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    saved_env: dict[str, str | None] = {name: os.environ.get(name) for name in environ}
    saved_levels = {name: logging.getLogger(name).level for name in _LOGGERS}
    for name, value in environ.items():
        os.environ.setdefault(name, value)
    for name in _LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    try:
        with loopback_stores():
            main(["--standalone", "--nproc-per-node", str(nproc), "--max-restarts", "0", "-m", "pitfalls", "doctor",
                  *doctor_argv])
    except ChildFailedError as failed:
        # Rank 0 exits with the worst rank's status; a rank killed by a signal fails the run too.
        first = failed.failures.get(0) or next(iter(failed.failures.values()))
        return first.exitcode if first.exitcode > 0 else 1
    finally:
        for name, level in saved_levels.items():
            logging.getLogger(name).setLevel(level)
        for name, kept in saved_env.items():
            if kept is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = kept
    return 0

"""The calibration family: planted costs (busy-wait 2T against T, k `.item()` against 0, N MiB touched).

The shared figures of benchmarks/common.py measured on known answers: ``Call.time_call`` reads T or 2T,
``Speedup.track_speedup`` 2.0, ``SyncHazards.track_sync_hazards`` k and 0, ``Call.peakmem_call`` N MiB above the
process's own. The site shows each instrument's reading over commits, machines and torch versions.

``Error.track_error`` (and ``ErrorIn<unit>.track_error`` for checks with an absolute tolerance) is the whole
calibration table over commits: one series per check of `pitfalls calibrate`, holding its error.
"""

from . import common

globals().update(common.family_classes("calibration", __name__, time=("Call", "call")))
globals().update(common.calibration_error_classes(__name__))

"""The skips a test run may show: hardware this machine lacks, or an opt-in test. Any other skip is a failure.

`scripts/test` sets ``PITFALLS_STRICT_SKIPS=1``: the run then ends with every skip reason grouped (allowed and
not), just above pytest's closing "N passed" line, and exits 1 if a skip is not allowed here. Run alone, pytest
prints the same groups and keeps its exit status.
"""

from __future__ import annotations

import re

# (why a skip is allowed, the reasons it covers). Keep it short: each entry is hardware or an explicit opt-in.
ALLOWED: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("no CUDA device", re.compile(r"no CUDA device|needs a CUDA device|torch built without CUDA|"
                                  r"needs a machine without CUDA|CUDA is usable here|checks .* (where there is|on a "
                                  r"machine) (no CUDA device|without CUDA)|this machine has a CUDA device|"
                                  r"NVML works here|needs a CUDA device and its driver's NVML")),
    ("fewer than 2 GPUs", re.compile(r"needs 2 or more CUDA devices|fewer than 2 GPUs")),
    ("no nvjpeg (the device JPEG decoder)", re.compile(r"torchvision\.io\.decode_jpeg\(device='cuda'\)")),
    ("fewer CPU cores", re.compile(r"num_workers=\d+ is more than the \d+ usable CPU cores here")),
    ("opt-in: the registry rebuild of vendored files", re.compile(r"set PITFALLS_REFRESH_TEST=1 to run it")),
    # scripts/test installs Slurm's packages as root; without root its daemons cannot run, and a host name that is
    # not on loopback would put them on the network.
    ("no Slurm cluster (not root, or the host name not on loopback)", re.compile(r"^no Slurm cluster: ")),
    # Not hardware: parameter sets of a grid that name no case of the loader (tests/ab sweeps the whole grid).
    ("no such case: a JPEG rung on PNG",
     re.compile(r"^(gpu|host)_decode decodes JPEG; this case has image_format='png'$")),
    ("no such case: a cold page cache for a rung that reads no file",
     re.compile(r"^cache='cold' applies to the rungs that read files \(.*\); \w+ holds its items in RAM$")),
)

STRICT_ENV = "PITFALLS_STRICT_SKIPS"


def allowed(reason: str) -> str | None:
    """The allow-list entry a skip reason falls under, or None when it is not allowed."""
    for why, pattern in ALLOWED:
        if pattern.search(reason):
            return why
    return None


def grouped(reasons: list[str]) -> tuple[dict[str, int], dict[str, int]]:
    """Count skip reasons: (allowed ones by allow-list entry, the others by reason)."""
    ok: dict[str, int] = {}
    unexpected: dict[str, int] = {}
    for reason in reasons:
        why = allowed(reason)
        if why is None:
            unexpected[reason] = unexpected.get(reason, 0) + 1
        else:
            ok[why] = ok.get(why, 0) + 1
    return ok, unexpected

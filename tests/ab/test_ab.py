"""Fast local A/B runs with pytest-benchmark: every variant of a family timed in one session, grouped.

    bash scripts/ab                       # all families, compared within each group
    bash scripts/ab -k sampler --benchmark-save=before   # then change code and
    bash scripts/ab -k sampler --benchmark-compare       # compare with the saved run

In the normal test run these execute once each (``--benchmark-disable``), as a check that every variant runs.
"""

from __future__ import annotations

import pytest

from pitfalls.cases import build_case
from pitfalls.devices import available_devices, synchronize
from pitfalls.registry import families, variants

# Small enough for a laptop CPU; the asv suite owns the size sweeps.
AB_SIZES = {
    "loss": [{"batch": 4, "image_size": 32}],
    "sampler": [{"n": 10_000, "batch": 1}, {"n": 10_000, "batch": 32}],
}

CASES = [
    pytest.param(family, variant, sizes, device, id=f"{family}-{variant}-{'-'.join(map(str, sizes.values()))}-{device}")
    for family in families()
    for sizes in AB_SIZES[family]
    for variant in variants(family)
    for device in available_devices()
]


def test_every_family_has_ab_sizes():
    assert set(AB_SIZES) == set(families())


@pytest.mark.parametrize(("family", "variant", "sizes", "device"), CASES)
def test_ab(benchmark, family, variant, sizes, device):
    case = build_case(family, variant, device=device, **sizes)
    benchmark.group = f"{family} {' '.join(f'{k}={v}' for k, v in sizes.items())} {device}"
    benchmark.extra_info.update(family=family, variant=variant, device=device, **sizes)

    def one_call():
        case()
        # Without the wait a CUDA call would be timed as its launch only.
        synchronize(case.device)

    one_call()  # warm-up outside the timed rounds (allocator, lazy init)
    benchmark(one_call)
